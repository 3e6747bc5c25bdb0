package compiler_test

import (
	"context"
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/kiln-ml/kiln/artifact"
	"github.com/kiln-ml/kiln/compiler"
	"github.com/kiln-ml/kiln/compiler/frontend/nn"
	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/devices"
	"github.com/kiln-ml/kiln/devices/cpu"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/ndarray"
	"github.com/kiln-ml/kiln/packedfunc"
	"github.com/kiln-ml/kiln/vm"
)

// seedMLP is the IRModule tutorial's model: 784 → 256 → ReLU → 10.
func seedMLP() nn.Module {
	return nn.NewNamedSequential(
		nn.Named("fc1", nn.NewLinear(784, 256, true)),
		nn.Named("relu1", nn.NewReLU()),
		nn.Named("fc2", nn.NewLinear(256, 10, true)),
	)
}

// TestMLPEndToEnd builds the IRModule tutorial's MLP with the NN builder, compiles it
// through the default O2 pipeline (two fused kernels; the weights' transposes,
// fc1's with the packing of its weight in column panels, lifted), runs it
// on the VM with both allocators and checks it against a float64
// reference computed from the same weights.
func TestMLPEndToEnd(t *testing.T) {
	mod, params, err := nn.Export(seedMLP(), nn.Spec{Inputs: []nn.Input{{Name: "x", Shape: []int64{1, 784}, DType: ir.Float32}}, Seed: 7})
	check.NoError(t, err)
	a, err := compiler.Build(context.Background(), mod, compiler.Target{Kind: "cpu"}, compiler.BuildOptions{})
	check.NoError(t, err)
	var kernels []string
	for _, f := range a.Manifest.Functions {
		kernels = append(kernels, f.Name)
	}
	for _, want := range []string{"fused_matmul_add_relu", "fused_matmul1_add1", "fused_transpose_reshape_transpose1", "transpose2"} {
		check.True(t, slices.Contains(kernels, want), "kernel", want, "missing from", kernels)
	}

	rng := rand.New(rand.NewPCG(1, 2))
	xs := make([]float32, 784)
	for i := range xs {
		xs[i] = rng.Float32()*2 - 1
	}
	x, err := ndarray.FromSlice(xs, ndarray.Shape{1, 784})
	check.NoError(t, err)
	ps, err := params.NDArrays(devices.CPUDevice)
	check.NoError(t, err)
	args := []packedfunc.Value{packedfunc.Array(x)}
	host := map[string][]float32{}
	for _, name := range params.Names() {
		args = append(args, packedfunc.Array(ps[name]))
		host[name], err = ndarray.ToSlice[float32](ps[name])
		check.NoError(t, err)
	}
	want := mlpReference(xs, host)

	kmod, err := cpu.LoadArtifact(a, t.TempDir())
	check.NoError(t, err)
	exe, err := vm.Unmarshal(a.Files[artifact.VMExec])
	check.NoError(t, err)
	for _, cfg := range []string{vm.MemoryNaive, vm.MemoryPooled} {
		m, err := vm.New(exe, kmod, devices.CPUDevice, vm.Options{MemoryCfg: cfg})
		check.NoError(t, err)
		for range 2 {
			out, err := m.Invoke("main", args...)
			check.NoError(t, err)
			oa, err := out.Array()
			check.NoError(t, err)
			check.Equal(t, oa.Shape(), ndarray.Shape{1, 10})
			got, err := ndarray.ToSlice[float32](oa)
			check.NoError(t, err)
			for i := range want {
				if d := math.Abs(float64(got[i]) - want[i]); d > 1e-4*math.Max(1, math.Abs(want[i])) {
					t.Fatalf("%s: output %d = %g, want %g", cfg, i, got[i], want[i])
				}
			}
		}
	}
}

// mlpReference computes relu(x W1ᵀ + b1) W2ᵀ + b2 in float64.
func mlpReference(x []float32, p map[string][]float32) []float64 {
	h := make([]float64, 256)
	for j := range 256 {
		s := float64(p["fc1.bias"][j])
		for k := range 784 {
			s += float64(x[k]) * float64(p["fc1.weight"][j*784+k])
		}
		h[j] = math.Max(s, 0)
	}
	out := make([]float64, 10)
	for j := range 10 {
		s := float64(p["fc2.bias"][j])
		for k := range 256 {
			s += h[k] * float64(p["fc2.weight"][j*256+k])
		}
		out[j] = s
	}
	return out
}
