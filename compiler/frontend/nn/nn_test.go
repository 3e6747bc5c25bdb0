package nn

import (
	"bytes"
	"encoding/binary"
	"flag"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/script"
	_ "github.com/kiln-ml/kiln/devices/cpu"
	"github.com/kiln-ml/kiln/internal/check"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden from the printer's output")

// seedMLP is the IRModule tutorial's RelaxModel: fc1 (784 → 256), relu1, fc2 (256 → 10).
func seedMLP() Module {
	return NewNamedSequential(
		Named("fc1", NewLinear(784, 256, true)),
		Named("relu1", NewReLU()),
		Named("fc2", NewLinear(256, 10, true)),
	)
}

var mlpInput = []Input{{Name: "x", Shape: []int64{1, 784}, DType: ir.Float32}}

func parseTestdata(t *testing.T, path string) *ir.IRModule {
	t.Helper()
	src, err := os.ReadFile(path)
	check.NoError(t, err)
	m, err := script.Parse(path, string(src))
	check.NoError(t, err, "parse", path)
	return m
}

// TestSeedMLP checks that the MLP built with the builder is the module
// TVM's export_tvm printed in TVM's IRModule tutorial (mod_from_relax, function
// "forward"), to the byte when printed, and, exported as "main", the
// module of the IRModule tutorial's TVMScript source (the same graph written by hand).
func TestSeedMLP(t *testing.T) {
	tests := []struct {
		name, fn, file, golden string
	}{
		{"from_relax", "forward", "001_from_relax.py", "001_from_relax.golden"},
		{"tvmscript_source", "main", "001_tvmscript_source.py", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			mod, params, err := Export(seedMLP(), Spec{Func: tc.fn, Inputs: mlpInput, Seed: 1})
			check.NoError(t, err)
			want := parseTestdata(t, filepath.Join("..", "..", "script", "testdata", tc.file))
			check.True(t, ir.StructuralEqual(mod, want), "built module differs from", tc.file, "\n", script.Print(mod))
			if tc.golden != "" {
				golden, err := os.ReadFile(filepath.Join("..", "..", "script", "testdata", tc.golden))
				check.NoError(t, err)
				check.Equal(t, script.Print(mod), string(golden), "printed module")
			}
			check.Equal(t, params.Names(), []string{"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"})
		})
	}
}

// TestParams checks the weights: shapes, the init's bounds, determinism
// by seed, and a safetensors round trip.
func TestParams(t *testing.T) {
	_, p1, err := Export(seedMLP(), Spec{Inputs: mlpInput, Seed: 7})
	check.NoError(t, err)
	_, p2, err := Export(seedMLP(), Spec{Inputs: mlpInput, Seed: 7})
	check.NoError(t, err)
	_, p3, err := Export(seedMLP(), Spec{Inputs: mlpInput, Seed: 8})
	check.NoError(t, err)
	shapes := map[string][]int64{"fc1.weight": {256, 784}, "fc1.bias": {256}, "fc2.weight": {10, 256}, "fc2.bias": {10}}
	bound := map[string]float64{"fc1.weight": 1 / math.Sqrt(784), "fc1.bias": 1 / math.Sqrt(784), "fc2.weight": 1 / 16.0, "fc2.bias": 1 / 16.0}
	for _, p := range p1.List() {
		check.Equal(t, p.Shape, shapes[p.Name], p.Name)
		check.Equal(t, p.DType, ir.Float32, p.Name)
		vals := float32s(p.Data)
		check.Equal(t, int64(len(vals)), prod(p.Shape), p.Name, "element count")
		var sum float64
		for _, v := range vals {
			check.True(t, math.Abs(float64(v)) <= bound[p.Name], p.Name, "value", v, "outside ±", bound[p.Name])
			sum += math.Abs(float64(v))
		}
		// Uniform in ±k has mean |v| = k/2; the biases are small samples.
		check.True(t, sum/float64(len(vals)) > bound[p.Name]/4, p.Name, "values look degenerate")
		q, ok := p2.Get(p.Name)
		check.True(t, ok)
		check.True(t, bytes.Equal(p.Data, q.Data), p.Name, "differs between two exports with one seed")
		r, _ := p3.Get(p.Name)
		check.True(t, !bytes.Equal(p.Data, r.Data), p.Name, "is the same under another seed")
	}

	path := filepath.Join(t.TempDir(), "params.safetensors")
	check.NoError(t, p1.Save(path))
	back, err := LoadParams(path)
	check.NoError(t, err)
	check.Equal(t, back.Names(), p1.Names(), "order")
	for _, p := range p1.List() {
		q, ok := back.Get(p.Name)
		check.True(t, ok, p.Name)
		check.Equal(t, q.Shape, p.Shape, p.Name)
		check.Equal(t, q.DType, p.DType, p.Name)
		check.True(t, bytes.Equal(q.Data, p.Data), p.Name, "data changed in the round trip")
	}
}

func float32s(b []byte) []float32 {
	out := make([]float32, len(b)/4)
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return out
}

func prod(shape []int64) int64 {
	n := int64(1)
	for _, d := range shape {
		n *= d
	}
	return n
}

// TestLayers exports one small model per layer and compares the printed
// module with testdata/<name>.golden (refresh with -update).
func TestLayers(t *testing.T) {
	f32 := func(name string, dims ...int64) []Input {
		return []Input{{Name: name, Shape: dims, DType: ir.Float32}}
	}
	tests := []struct {
		name   string
		model  Module
		inputs []Input
		params []string
	}{
		{"linear_no_bias", NewLinear(8, 4, false), f32("x", 2, 8), []string{"weight"}},
		{"conv2d", NewSequential(
			NewConv2D(3, 8, 3, Conv2DConfig{Padding: []int64{1}}),
			NewReLU(),
			NewConv2D(8, 8, 3, Conv2DConfig{Stride: []int64{2}, Dilation: []int64{1, 1}, Groups: 4, NoBias: true}),
		), f32("data", 1, 3, 16, 16), []string{"0.weight", "0.bias", "2.weight"}},
		{"layer_norm", NewNamedSequential(
			Named("ln", NewLayerNorm([]int64{16}, 1e-6, true)),
			Named("ln_plain", NewLayerNorm([]int64{4, 16}, 0, false)),
		), f32("h", 2, 4, 16), []string{"ln.weight", "ln.bias"}},
		{"embedding", NewNamedSequential(
			Named("embed", NewEmbedding(100, 32)),
			Named("norm", NewLayerNorm([]int64{32}, 0, true)),
			Named("proj", NewLinear(32, 8, true)),
		), []Input{{Name: "ids", Shape: []int64{2, 5}, DType: ir.Int32}},
			[]string{"embed.weight", "norm.weight", "norm.bias", "proj.weight", "proj.bias"}},
		{"embedding_1d", NewEmbedding(10, 4), []Input{{Name: "ids", Shape: []int64{3}, DType: ir.Int64}}, []string{"weight"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			mod, params, err := Export(tc.model, Spec{Inputs: tc.inputs})
			check.NoError(t, err)
			check.Equal(t, params.Names(), tc.params)
			text := script.Print(mod)
			golden := filepath.Join("testdata", tc.name+".golden")
			if *update {
				check.NoError(t, os.WriteFile(golden, []byte(text), 0o644))
			}
			want, err := os.ReadFile(golden)
			check.NoError(t, err, "run with -update to create it")
			check.Equal(t, text, string(want))
			back, err := script.Parse(golden, text)
			check.NoError(t, err)
			check.True(t, ir.StructuralEqual(back, mod), "the golden parses back to the built module")
		})
	}
}

// TestExportErrors checks that bad models and inputs are errors naming
// the problem, never panics.
func TestExportErrors(t *testing.T) {
	x := mlpInput
	tests := []struct {
		name  string
		model Module
		spec  Spec
		want  []string
	}{
		{"shape mismatch", NewLinear(10, 5, true), Spec{Inputs: x}, []string{"matmul", "(1, 784)", "(10, 5)"}},
		{"no inputs", seedMLP(), Spec{}, []string{"no inputs"}},
		{"two inputs without Forward", seedMLP(), Spec{Inputs: append(x, Input{Name: "y", Shape: []int64{1}, DType: ir.Float32})}, []string{"2 inputs"}},
		{"input twice", seedMLP(), Spec{Inputs: []Input{x[0], x[0]}, Forward: func(b *Builder, xs []*Tensor) (*Tensor, error) { return xs[0], nil }}, []string{`input "x" defined twice`}},
		{"bad groups", NewConv2D(6, 4, 3, Conv2DConfig{Groups: 4}), Spec{Inputs: x}, []string{"4 groups do not divide"}},
		{"bad stride", NewConv2D(6, 4, 3, Conv2DConfig{Stride: []int64{1, 2, 3}}), Spec{Inputs: x}, []string{"stride: 3 values"}},
		{"bad linear", NewLinear(0, 4, true), Spec{Inputs: x}, []string{"feature counts must be positive"}},
		{"float indices", NewEmbedding(4, 2), Spec{Inputs: x}, []string{"integer dtype"}},
		{"nil child", NewSequential(NewReLU(), nil), Spec{Inputs: x}, []string{`module "1" is nil`}},
		{"foreign parameter", NewReLU(), Spec{Inputs: x, Forward: func(b *Builder, xs []*Tensor) (*Tensor, error) {
			return b.Param(NewParameter([]int64{2}, ir.Float32, nil))
		}}, []string{"not registered"}},
		{"bad dtype", &custom{p: NewParameter([]int64{2}, ir.Int8, nil)}, Spec{Inputs: x}, []string{"cannot initialize dtype int8"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := Export(tc.model, tc.spec)
			check.Error(t, err, tc.want...)
		})
	}
}

// custom is a user module with one parameter of its own.
type custom struct{ p *Parameter }

func (c *custom) Forward(b *Builder, x *Tensor) (*Tensor, error) { return x, nil }
func (c *custom) Params() []NamedParam                           { return []NamedParam{{"p", c.p}} }
func (c *custom) Children() []Child                              { return nil }
