package vm

import (
	"encoding/binary"
	"errors"
	"hash/crc32"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/devices"
	_ "github.com/kiln-ml/kiln/devices/cpu"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/ndarray"
)

// sample builds an executable that uses every constant kind, parameter
// form and instruction.
func sample(t testing.TB) *Executable {
	t.Helper()
	b := NewBuilder()
	w, err := ndarray.FromSlice([]float32{1, 2, 3, 4, 5, 6}, ndarray.Shape{2, 3})
	check.NoError(t, err)
	wc, err := b.Tensor(w)
	check.NoError(t, err)
	f := b.Function("main",
		TensorParam("x", ndarray.Float32, Sym("n"), Static(3)),
		TensorParam("s", ndarray.DType{}),
		KindParam("k", ParamInt),
		AnyParam("any"),
		Param{Name: "r2", Kind: ParamTensor, NDim: 2, DType: ndarray.Int8},
	)
	st := f.Call(BuiltinAllocStorage, b.Shape(2, 3), Imm(0), b.DType(ndarray.Float32), b.String("global"))
	y := f.Call(BuiltinAllocTensor, st, Imm(0), b.Shape(2, 3), b.DType(ndarray.Float32))
	els := f.NewLabel()
	f.If(f.Param(2), els)
	f.CallTo(NoReg, "kernel_a", f.Param(0), wc, y, Imm(-7), b.Float(2.5))
	f.Bind(els)
	n := f.Call(BuiltinNullValue)
	f.Ret(f.Call("helper", y, n))
	g := b.Function("helper", AnyParam("a"), AnyParam("b"))
	loop := g.NewLabel()
	g.Bind(loop)
	g.CallTo(1, BuiltinCopy, b.Nil())
	g.If(1, loop)
	g.Ret(g.Call(BuiltinMakeTuple, g.Param(0), g.Param(1), Imm(1<<40)))
	exe, err := b.Build()
	check.NoError(t, err)
	return exe
}

func TestMarshalRoundTrip(t *testing.T) {
	exe := sample(t)
	data, err := exe.Marshal()
	check.NoError(t, err)
	check.Equal(t, string(data[:len(Magic)]), Magic)
	got, err := Unmarshal(data)
	check.NoError(t, err)
	check.Equal(t, got, exe)
	check.Equal(t, got.String(), exe.String())
	again, err := got.Marshal()
	check.NoError(t, err)
	check.Equal(t, again, data)
	check.Equal(t, exe.Kernels(), []string{"kernel_a"})

	path := filepath.Join(t.TempDir(), "vm.bin")
	check.NoError(t, exe.Save(path))
	loaded, err := Load(path)
	check.NoError(t, err)
	check.Equal(t, loaded, exe)
	_, err = Load(filepath.Join(t.TempDir(), "missing.bin"))
	check.Error(t, err, "load executable")
}

// TestMarshalSources: the model operators a kernel computes survive the
// round trip (under a header flag); an executable without any is written
// as before, flags 0.
func TestMarshalSources(t *testing.T) {
	plain, err := sample(t).Marshal()
	check.NoError(t, err)
	check.Equal(t, binary.LittleEndian.Uint16(plain[len(Magic)+2:]), uint16(0))

	b := NewBuilder()
	f := b.Function("main", AnyParam("x"))
	f.CallTo(NoReg, "fused_conv2d_relu", f.Param(0))
	f.CallTo(NoReg, "fused_conv2d_relu", f.Param(0))
	b.AddSources("fused_conv2d_relu", Source{Name: "/conv1/Conv", Op: "Conv"}, Source{Name: "/relu/Relu", Op: "Relu"})
	b.AddSources("fused_conv2d_relu", Source{Name: "/conv1/Conv", Op: "Conv"}, Source{Name: "/conv2/Conv", Op: "Conv"})
	f.Ret(f.Param(0))
	exe, err := b.Build()
	check.NoError(t, err)
	want := []Source{{"/conv1/Conv", "Conv"}, {"/relu/Relu", "Relu"}, {"/conv2/Conv", "Conv"}}
	check.Equal(t, exe.FuncTable[0].Sources, want)
	data, err := exe.Marshal()
	check.NoError(t, err)
	check.Equal(t, binary.LittleEndian.Uint16(data[len(Magic)+2:]), uint16(flagSources))
	got, err := Unmarshal(data)
	check.NoError(t, err)
	check.Equal(t, got, exe)
}

// frame wraps a body in a header and checksum.
func frame(body []byte) []byte {
	b := append([]byte(Magic), 0, 0, 0, 0, 0, 0, 0, 0)
	binary.LittleEndian.PutUint16(b[len(Magic):], FormatVersion)
	binary.LittleEndian.PutUint32(b[len(Magic)+4:], uint32(len(body)))
	b = append(b, body...)
	return binary.LittleEndian.AppendUint32(b, crc32.ChecksumIEEE(b))
}

func TestUnmarshalCorrupt(t *testing.T) {
	good, err := sample(t).Marshal()
	check.NoError(t, err)
	body := good[headerLen : len(good)-4]

	mutate := func(f func(b []byte) []byte) []byte { return f(append([]byte(nil), good...)) }
	// encodeInvalid serializes an executable that Validate rejects.
	encodeInvalid := func(edit func(e *Executable)) []byte {
		e := sample(t)
		edit(e)
		b, err := e.encode()
		check.NoError(t, err)
		return b
	}
	for _, tc := range []struct {
		name string
		data []byte
		want string
	}{
		{"empty", nil, "0 bytes is shorter than the 20-byte header"},
		{"magic", mutate(func(b []byte) []byte { b[0] = 'X'; return b }), "bad magic"},
		{"version", mutate(func(b []byte) []byte { b[len(Magic)] = 9; return b }), "format version 9, this kiln reads 1"},
		{"flags", mutate(func(b []byte) []byte { b[len(Magic)+2] = 2; return b }), "unknown flags 0x2"},
		{"truncated", good[:len(good)-10], "truncated: header says"},
		{"trailing", append(append([]byte(nil), good...), 0), "bytes after the body"},
		{"checksum", mutate(func(b []byte) []byte { b[headerLen+3] ^= 0x40; return b }), "checksum mismatch"},
		{"body cut", frame(body[:len(body)/2]), "truncated: name length is 21 but only 9 bytes are left"},
		{"body extra", frame(append(append([]byte(nil), body...), 0)), "1 bytes left over"},
		{"huge count", frame([]byte{0xff, 0xff, 0xff, 0xff, 0x0f}), "constant count is 4294967295 but only 0 bytes are left"},
		{"bad const kind", frame([]byte{1, 99}), "constant 0: unknown constant kind 99"},
		{"bad opcode", encodeInvalid(func(e *Executable) { e.Functions[0].Code[0].Op = 77 }), "unknown opcode 77"},
		{"register", encodeInvalid(func(e *Executable) { e.Functions[0].Code[1].Args[0].Value = 99 }),
			`function "main": instruction 1: argument 0: register 99 out of range (function has 9 registers)`},
		{"constant", encodeInvalid(func(e *Executable) { e.Functions[0].Code[1].Args[2] = Arg{Kind: ArgConst, Value: 50} }), "constant 50 out of range"},
		{"target", encodeInvalid(func(e *Executable) { e.Functions[1].Code[1].Target = 40 }), `function "helper": instruction 1: jump target 40 outside the code`},
		{"func index", encodeInvalid(func(e *Executable) { e.Functions[0].Code[0].Func = 30 }), "function index 30 out of range"},
		{"builtin", encodeInvalid(func(e *Executable) { e.FuncTable[0].Name = "vm.builtin.nope" }), `unknown builtin "vm.builtin.nope"`},
		{"vm func", encodeInvalid(func(e *Executable) {
			for i := range e.FuncTable {
				if e.FuncTable[i].Kind == FuncVM {
					e.FuncTable[i].Name = "gone"
				}
			}
		}), `no VM function "gone"`},
		{"arity", encodeInvalid(func(e *Executable) { e.Functions[0].Code[1].Args = e.Functions[0].Code[1].Args[:2] }),
			"calls vm.builtin.alloc_tensor with 2 arguments, it takes 4"},
		{"falls off", encodeInvalid(func(e *Executable) { c := e.Functions[1].Code; e.Functions[1].Code = c[:len(c)-1] }), "would fall off the end"},
		{"duplicate", encodeInvalid(func(e *Executable) { e.Functions[1].Name = "main" }), `function "main" defined twice`},
		{"regs", encodeInvalid(func(e *Executable) { e.Functions[0].NumRegs = 2 }), "2 registers for 5 parameters"},
		{"tensor data", encodeInvalid(func(e *Executable) {
			for i := range e.Constants {
				if e.Constants[i].Kind == ConstTensor {
					e.Constants[i].Data = e.Constants[i].Data[:5]
				}
			}
		}), "tensor (2, 3) float32 has 5 bytes of data, want 24"},
		{"dtype", encodeInvalid(func(e *Executable) { e.Functions[0].Params[0].DType = ndarray.DType{Code: 2, Bits: 7, Lanes: 1} }), "bad dtype"},
		{"negative shape", encodeInvalid(func(e *Executable) { e.Constants[0].Shape = ndarray.Shape{-2} }), "dimension 0 is negative"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Unmarshal(tc.data)
			check.ErrorIs(t, err, ErrInvalid)
			check.Error(t, err, "vm: unmarshal executable", tc.want)
		})
	}
}

// TestUnmarshalEveryPrefix cuts the body at every length and flips every
// byte: each must give an error or a valid executable, never a panic.
func TestUnmarshalEveryPrefix(t *testing.T) {
	good, err := sample(t).Marshal()
	check.NoError(t, err)
	body := good[headerLen : len(good)-4]
	for n := range len(body) {
		_, err := Unmarshal(frame(body[:n]))
		check.ErrorIs(t, err, ErrInvalid)
	}
	for i := range body {
		b := append([]byte(nil), body...)
		b[i] ^= 0xff
		if e, err := Unmarshal(frame(b)); err == nil {
			check.NoError(t, e.Validate())
		}
	}
}

// FuzzUnmarshal feeds the decoder arbitrary bodies (the checksum would
// stop almost every mutation before the decoder). Whatever decodes must be
// valid, re-encode to the same bytes, and run in a VM without panicking.
func FuzzUnmarshal(f *testing.F) {
	good, err := sample(f).Marshal()
	check.NoError(f, err)
	f.Add(good[headerLen : len(good)-4])
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, body []byte) {
		e, err := decodeBody(body, 0)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("error does not wrap ErrInvalid: %v", err)
			}
			return
		}
		again, err := e.Marshal()
		if err != nil {
			t.Fatalf("decoded executable does not marshal: %v", err)
		}
		if e2, err := Unmarshal(again); err != nil || e2.String() != e.String() {
			t.Fatalf("round trip: %v", err)
		}
		runAll(e)
	})
}

// runAll runs every function of e with nil arguments under tight limits.
func runAll(e *Executable) {
	m, err := New(e, nil, devices.CPUDevice, Options{MaxSteps: 200, MaxDepth: 16, MaxAllocBytes: 1 << 16})
	if err != nil {
		return // an extern that does not resolve
	}
	defer m.Close()
	for _, f := range e.Functions {
		_, _ = m.InvokeValues(f.Name, make([]Value, len(f.Params))...)
	}
}

func TestFuzzCorpusDecodes(t *testing.T) {
	// The checked-in corpus must keep decoding without a panic as the
	// format evolves; its entries are run by FuzzUnmarshal, this only
	// checks they are there.
	entries, err := os.ReadDir(filepath.Join("testdata", "fuzz", "FuzzUnmarshal"))
	check.NoError(t, err)
	check.True(t, len(entries) > 0)
	for _, e := range entries {
		check.True(t, !strings.HasPrefix(e.Name(), "."), e.Name())
	}
}

// TestOperandKinds runs builtins with immediates and constants where
// registers are expected: errors, not panics.
func TestOperandKinds(t *testing.T) {
	for _, name := range []string{BuiltinAllocTensor, BuiltinShapeOf, BuiltinAllocStorage, BuiltinReshape, BuiltinTupleGetItem, BuiltinCopyInto, BuiltinReadIfCond, BuiltinCheckTensorInfo, BuiltinToDevice} {
		t.Run(name, func(t *testing.T) {
			bi, _ := builtinIndex(name)
			for _, op := range []Operand{Imm(5), Const(0)} {
				b := NewBuilder()
				b.Shape(2)
				f := b.Function("main")
				args := make([]Operand, builtins[bi].minArgs)
				for i := range args {
					args[i] = op
				}
				f.Ret(f.Call(name, args...))
				exe, err := b.Build()
				check.NoError(t, err)
				m, err := New(exe, nil, devices.CPUDevice, Options{MaxAllocBytes: 1 << 10})
				check.NoError(t, err)
				_, err = m.Invoke("main")
				if err != nil {
					check.Error(t, err, "main: instruction 0")
				}
			}
		})
	}
}
