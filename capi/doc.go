// Command capi is kiln's C API: the Go SDK (package client) and the
// compiler behind the functions of kiln.h, built as a shared library with
//
//	go build -buildmode=c-shared -o libkiln.so ./capi
//
// Other languages bind to it (the Python package kiln in python/ does, with
// ctypes), so the wire protocol and the compiler have one implementation.
//
// Objects cross the boundary as opaque handles (uint64, never 0) in one
// table; kiln_free releases one and kiln_live_handles counts them, so a
// binding can check it leaks none. Errors set a thread-local message and
// class (support.c) read with kiln_last_error and kiln_last_error_kind.
// Tensors cross as DLPack: host memory given to a copy is read or written
// in place, and local arrays are shared with other libraries both ways
// through DLManagedTensor.
//
// capi imports client, compiler, devices, ndarray, packedfunc and vm; it is
// never imported.
package main

func main() {}
