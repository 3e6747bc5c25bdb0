package cuda

import (
	"math"
	"testing"

	"github.com/kiln-ml/kiln/devices"
	_ "github.com/kiln-ml/kiln/devices/cpu"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/ndarray"
	"github.com/kiln-ml/kiln/packedfunc"
)

func TestErrorFormat(t *testing.T) {
	tests := []struct {
		name string
		err  *Error
		want string
	}{
		{"Plain", &Error{Op: "alloc 16 bytes on cuda:0", Code: 2, Name: "CUDA_ERROR_OUT_OF_MEMORY", Msg: "out of memory"},
			"cuda alloc 16 bytes on cuda:0: CUDA_ERROR_OUT_OF_MEMORY: out of memory"},
		{"WithLog", &Error{Op: "load ptx on cuda:0", Code: 218, Name: "CUDA_ERROR_INVALID_PTX", Msg: "a PTX JIT compilation failed", Log: "ptxas fatal: bad"},
			"cuda load ptx on cuda:0: CUDA_ERROR_INVALID_PTX: a PTX JIT compilation failed\nptxas fatal: bad"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { check.Equal(t, tc.err.Error(), tc.want) })
	}
}

func TestValidateKernels(t *testing.T) {
	tests := []struct {
		name    string
		kernels []KernelInfo
		want    string // "" for valid
	}{
		{"Valid", []KernelInfo{{Name: "a", Params: []ParamKind{ParamPtr, ParamInt32, ParamInt64, ParamFloat32, ParamFloat64}}, {Name: "b"}}, ""},
		{"NoName", []KernelInfo{{Params: []ParamKind{ParamPtr}}}, "kernel 0 has no name"},
		{"Twice", []KernelInfo{{Name: "a"}, {Name: "a"}}, `kernel "a" is listed twice`},
		{"BadKind", []KernelInfo{{Name: "a", Params: []ParamKind{ParamPtr, "float16"}}}, `kernel "a" parameter 1: unknown kind "float16"`},
		{"NegativeShared", []KernelInfo{{Name: "a", SharedMem: -1}}, "dynamic shared memory -1"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := validateKernels(tc.kernels)
			if tc.want == "" {
				check.NoError(t, err)
				return
			}
			check.Error(t, err, tc.want)
		})
	}
}

var testLimits = limits{maxThreads: 1024, block: [3]int64{1024, 1024, 64}, grid: [3]int64{math.MaxInt32, 65535, 65535}}

func TestPackArgs(t *testing.T) {
	// The CPU stands in for the module's device: packing never calls the
	// driver.
	dev := devices.CPUDevice
	arr, err := ndarray.Empty(ndarray.Shape{4}, ndarray.Float32, dev)
	check.NoError(t, err)
	defer arr.Release()
	k := KernelInfo{Name: "k", Params: []ParamKind{ParamPtr, ParamInt32, ParamInt64, ParamFloat32, ParamFloat64}}
	args := []packedfunc.Value{packedfunc.Array(arr), packedfunc.Int(-1), packedfunc.Int(-5), packedfunc.Float(1.5), packedfunc.Int(3),
		packedfunc.Int(7), packedfunc.Int(2), packedfunc.Int(1), packedfunc.Int(128), packedfunc.Int(2), packedfunc.Int(4)}
	vals := make([]uint64, len(k.Params))
	dims, err := packArgs(k, dev, &testLimits, args, vals)
	check.NoError(t, err)
	check.Equal(t, dims, [LaunchArgs]uint32{7, 2, 1, 128, 2, 4})
	check.Equal(t, vals, []uint64{
		uint64(arr.Data()),
		0xffffffff,          // int32 -1 in the low 4 bytes
		uint64(1<<64 - 5),   // int64 -5
		0x3fc00000,          // float32 1.5 in the low 4 bytes
		math.Float64bits(3), // float64 from an int
	})
}

func TestPackArgsErrors(t *testing.T) {
	gpu := devices.Device{Type: devices.CUDA, ID: 0}
	host, err := ndarray.Empty(ndarray.Shape{4}, ndarray.Float32, devices.CPUDevice)
	check.NoError(t, err)
	defer host.Release()
	k := KernelInfo{Name: "scale", Params: []ParamKind{ParamPtr, ParamFloat32, ParamInt32}}
	I, F, S := packedfunc.Int, packedfunc.Float, packedfunc.String
	dims := []packedfunc.Value{I(1), I(1), I(1), I(32), I(1), I(1)}
	with := func(p ...packedfunc.Value) []packedfunc.Value { return append(p, dims...) }
	launch := func(d ...int64) []packedfunc.Value {
		out := []packedfunc.Value{packedfunc.Array(host), F(2), I(4)}
		for _, x := range d {
			out = append(out, I(x))
		}
		return out
	}
	tests := []struct {
		name string
		dev  devices.Device
		args []packedfunc.Value
		want []string
	}{
		{"Arity", gpu, with(packedfunc.Array(host)), []string{"scale", "wrong number of arguments", "want 9", "got 7"}},
		{"WrongDevice", gpu, with(packedfunc.Array(host), F(2), I(4)), []string{"scale: argument 0", "cpu:0", "cuda:0"}},
		{"NilArray", devices.CPUDevice, with(packedfunc.Nil, F(2), I(4)), []string{"scale: argument 0", "want ndarray, got nil"}},
		{"StringFloat", devices.CPUDevice, with(packedfunc.Array(host), S("2"), I(4)), []string{"scale: argument 1", "float32"}},
		{"FloatInt", devices.CPUDevice, with(packedfunc.Array(host), F(2), F(4)), []string{"scale: argument 2", "int32", "want int, got float"}},
		{"Int32Range", devices.CPUDevice, with(packedfunc.Array(host), F(2), I(math.MaxInt32+1)), []string{"scale: argument 2", "2147483648 does not fit int32"}},
		{"ZeroBlock", devices.CPUDevice, launch(1, 1, 1, 0, 1, 1), []string{"scale: argument 6", "blockX is 0"}},
		{"FloatDim", devices.CPUDevice, append(launch(1, 1, 1, 1, 1), F(1)), []string{"scale: argument 8", "blockZ"}},
		{"GridY", devices.CPUDevice, launch(1, 70000, 1, 32, 1, 1), []string{"scale: argument 4", "gridY is 70000", "want 1 to 65535"}},
		{"BlockZ", devices.CPUDevice, launch(1, 1, 1, 1, 1, 65), []string{"scale: argument 8", "blockZ is 65", "want 1 to 64"}},
		{"Threads", devices.CPUDevice, launch(1, 1, 1, 32, 32, 2), []string{"scale: block 32x32x2 has 2048 threads", "at most 1024"}},
		{"Uint32", devices.CPUDevice, launch(1<<33, 1, 1, 32, 1, 1), []string{"scale: argument 3", "gridX"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			vals := make([]uint64, len(k.Params))
			_, err := packArgs(k, tc.dev, &testLimits, tc.args, vals)
			check.Error(t, err, tc.want...)
		})
	}
}
