// Package vm owns kiln's graph-level virtual machine: the bytecode (Call,
// Ret, Goto, If over per-frame registers and a constant pool), the
// executable format stored as vm.bin in .kiln artifacts (Marshal and
// Unmarshal, versioned and checksummed), the Builder that the compiler's VM
// code generator calls to emit executables, the interpreter (VM) that runs
// them by calling compiled kernels, VM builtins and other VM functions, and
// the storage allocators (naive and pooled) behind vm.builtin.alloc_storage.
//
// vm imports devices, ndarray and packedfunc only. It must not import the
// compiler (the device daemon runs executables without linking it) nor any
// device backend: kernels come from the caller as a packedfunc.Module, and
// memory from the devices registry.
//
// A VM is not safe for concurrent use; give each goroutine its own VM (they
// may share one Executable, which is read-only once built).
package vm
