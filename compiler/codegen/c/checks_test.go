package c_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/kiln-ml/kiln/abi"
	"github.com/kiln-ml/kiln/compiler/codegen/c"
	"github.com/kiln-ml/kiln/compiler/script"
	"github.com/kiln-ml/kiln/compiler/toolchain"
	"github.com/kiln-ml/kiln/compiler/transform"
	"github.com/kiln-ml/kiln/devices"
	"github.com/kiln-ml/kiln/devices/cpu"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/ndarray"
	"github.com/kiln-ml/kiln/packedfunc"
)

// TestGeneratedChecks calls generated functions with wrong arguments that
// get past the loader: the module exports metadata that declares every
// tensor without dtype or shape (and vecadd with two parameters), so the
// generated prologue is what rejects the call, through KernelError.
func TestGeneratedChecks(t *testing.T) {
	src, err := os.ReadFile(filepath.Join("testdata", "kernels.py"))
	check.NoError(t, err)
	m, err := script.Parse("kernels.py", string(src))
	check.NoError(t, err)
	l, err := transform.LowerModule(m, transform.Options{Verify: true})
	check.NoError(t, err)
	loose := &abi.Metadata{FormatVersion: abi.Version, Target: "cpu", Functions: []abi.FuncInfo{
		{Name: "vecadd", Params: []abi.ParamInfo{{Name: "A", Kind: abi.ParamTensor}, {Name: "B", Kind: abi.ParamTensor}}},
		{Name: "microkernel", Params: []abi.ParamInfo{{Name: "A", Kind: abi.ParamTensor}, {Name: "B", Kind: abi.ParamInt}, {Name: "C", Kind: abi.ParamTensor}}},
		{Name: "scalars", Params: []abi.ParamInfo{{Name: "X", Kind: abi.ParamTensor}, {Name: "alpha", Kind: abi.ParamFloat}, {Name: "off", Kind: abi.ParamInt}}},
		{Name: "relu_vec", Params: []abi.ParamInfo{{Name: "A", Kind: abi.ParamTensor}, {Name: "B", Kind: abi.ParamTensor}, {Name: "C", Kind: abi.ParamTensor}}},
	}}
	text, meta, err := c.Generate(l, c.Options{Metadata: loose})
	check.NoError(t, err)
	check.Equal(t, len(meta.Functions), 4)
	ctx := context.Background()
	tc, err := toolchain.Find(ctx, toolchain.Options{Flags: []string{"-O1", "-Wall", "-Werror"}})
	check.NoError(t, err)
	so := filepath.Join(t.TempDir(), "k.so")
	check.NoError(t, tc.BuildShared(ctx, []toolchain.Source{{Name: "k.c", Text: text}}, so, ""))
	mod, err := cpu.LoadModule(so)
	check.NoError(t, err)
	defer mod.Close()

	arr := func(dt ndarray.DType, shape ...int64) packedfunc.Value {
		a, err := ndarray.Empty(ndarray.Shape(shape), dt, devices.CPUDevice)
		check.NoError(t, err)
		return packedfunc.Array(a)
	}
	f32 := ndarray.Float32
	strided := func() packedfunc.Value {
		a, err := ndarray.Empty(ndarray.Shape{8, 8}, f32, devices.CPUDevice)
		check.NoError(t, err)
		v, err := a.StridedView(ndarray.Shape{4, 8}, f32, []int64{16, 1}, 0)
		check.NoError(t, err)
		return packedfunc.Array(v)
	}
	tests := []struct {
		name string
		fn   string
		args []packedfunc.Value
		want string // "" means the call succeeds
	}{
		{"arity", "vecadd", []packedfunc.Value{arr(f32, 4), arr(f32, 4)}, `vecadd: wrong number of arguments: want 3`},
		{"type code", "microkernel", []packedfunc.Value{arr(f32, 16, 24), packedfunc.Int(3), arr(f32, 16, 32)}, `microkernel: argument "B" (#1): want a tensor`},
		{"ndim", "relu_vec", []packedfunc.Value{arr(f32, 64, 1), arr(f32, 64), arr(ndarray.Int32, 64)}, `relu_vec: argument "A" (#0): want 1 dimension`},
		{"dtype", "relu_vec", []packedfunc.Value{arr(f32, 64), arr(f32, 64), arr(f32, 64)}, `relu_vec: argument "C" (#2): want dtype int32`},
		{"static shape", "relu_vec", []packedfunc.Value{arr(f32, 64), arr(f32, 65), arr(ndarray.Int32, 64)}, `relu_vec: argument "B" (#1): dimension 0 must be 64`},
		{"static shape 2", "scalars", []packedfunc.Value{arr(f32, 4, 9), packedfunc.Float(1), packedfunc.Int(0)}, `scalars: argument "X" (#0): dimension 1 must be 8`},
		{"strides", "scalars", []packedfunc.Value{strided(), packedfunc.Float(1), packedfunc.Int(0)}, `scalars: argument "X" (#0): want compact (row-major) strides`},
		{"good", "relu_vec", []packedfunc.Value{arr(f32, 64), arr(f32, 64), arr(ndarray.Int32, 64)}, ""},
		{"good symbolic", "scalars", []packedfunc.Value{arr(f32, 3, 8), packedfunc.Float(2), packedfunc.Int(1)}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fn, err := mod.GetFunction(tt.fn)
			check.NoError(t, err)
			_, err = fn.Call(tt.args...)
			if tt.want == "" {
				check.NoError(t, err)
				return
			}
			var ke *cpu.KernelError
			check.True(t, errors.As(err, &ke), "want a KernelError, got", err)
			check.Equal(t, ke.Msg, tt.want)
		})
	}
}
