package transform

import (
	"flag"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/kiln-ml/kiln/compiler/ir"
	_ "github.com/kiln-ml/kiln/compiler/relax/op"
	"github.com/kiln-ml/kiln/compiler/script"
	"github.com/kiln-ml/kiln/internal/check"
)

// init registers -update unless another test file of the package did
// (package-level variables are initialized before any init runs).
func init() {
	if flag.Lookup("update") == nil {
		flag.Bool("update", false, "rewrite testdata/*.golden from the printer's output")
	}
}

func annotateUsedMemoryUpdate() bool {
	f := flag.Lookup("update")
	return f != nil && f.Value.String() == "true"
}

// TestAnnotateUsedMemory runs every case of TVM's AnnotateUsedMemory tests, written in the text
// format in testdata/annotate_used_memory_*.py, and checks the published
// figures; the annotated module is compared with the .golden beside it.
// The cases after the published ones (aliases, no_main) cover what Relax adds.
func TestAnnotateUsedMemory(t *testing.T) {
	seq := func(first, step int64, n int) []int64 {
		out := make([]int64, n)
		for i := range out {
			out[i] = first + step*int64(i)
		}
		return out
	}
	tests := []struct {
		name string
		// used maps each primitive function to its used_memory.
		used map[string][]int64
		io   int64
		err  string
	}{
		{name: "single_pool", used: map[string][]int64{"pool": {2 * (1 * 2 * 2 * 4)}}, io: 2 * (1 * 2 * 2 * 4)},
		{name: "three_pools", used: map[string][]int64{
			"pool0": {1*8*8*2 + 1*7*7*2},
			"pool1": {1*7*7*2 + 1*6*6*2},
			"pool2": {1*6*6*2 + 1*5*5*2},
		}, io: 1*8*8*2 + 1*5*5*2},
		{name: "mixed_dtypes", used: map[string][]int64{"cast": {(1*2*2*2)*2 + (1*2*2*2)*4}}, io: (1*2*2*2)*2 + (1*2*2*2)*4},
		{name: "concatenate", used: map[string][]int64{
			"reshape0": {1*4*5*6 + 1*4*30},
			"reshape1": {1*4*5*6 + 1*4*30 + 1*4*30}, // the first result is alive too
		}, io: 1*4*5*6 + 1*4*60},
		{name: "many_parallel_calls", used: map[string][]int64{
			"prim1": {2 * 120},
			"prim2": {3 * 120},
			"prim3": {4 * 120},
			"prim4": {3*120 + 1*4*5*18},
		}, io: 120 + 1*4*5*18},
		{name: "nested_branches", used: map[string][]int64{
			"prim1": {2 * 16}, "prim2": {3 * 16}, "prim3": {3 * 16}, "prim4": {4 * 16},
		}, io: 16 + 1*2*2*12},
		{name: "composite_inner_function", used: map[string][]int64{"prim": {1*2*2*4 + 1*1*1*4}}, io: 1*2*2*4 + 1*1*1*4},
		{name: "multiple_calls_to_same_function", used: map[string][]int64{"pool": {32, 32}}, io: 32},
		{name: "parallel_calls_to_same_function", used: map[string][]int64{"pool": {32, 48}}, io: 48},
		{name: "parallel_calls_with_non_input_argument", used: map[string][]int64{
			"prim1": {120 + 120},
			"prim2": seq(120+80, 80, 20), // 120 + 80*i for i in 1..20
		}, io: 120 + 1*4*4*(5*20)},
		{name: "aliases", used: map[string][]int64{"pool": {32, 96}, "pair": {80}}, io: 80},
		{name: "no_main", err: `no function "main"`},
		{name: "dynamic_io_tensor", err: "AnnotateUsedMemory does not support dynamic shapes"},
		{name: "dynamic_callsite_tensor", err: "AnnotateUsedMemory does not support dynamic shapes"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join("testdata", "annotate_used_memory_"+tc.name+".py")
			src, err := os.ReadFile(path)
			check.NoError(t, err)
			mod, err := script.Parse(path, string(src))
			check.NoError(t, err, "parse")
			got, err := AnnotateUsedMemory(mod)
			if tc.err != "" {
				check.Error(t, err, tc.err)
				if tc.err == ErrDynamicShape.Error() {
					check.ErrorIs(t, err, ErrDynamicShape)
				}
				return
			}
			check.NoError(t, err)
			check.NoError(t, ir.VerifyModule(got), "verify")
			for name, f := range got.Funcs() {
				attrs := f.FuncAttrs()
				want, annotated := tc.used[name]
				v, has := attrs[AttrUsedMemory]
				check.Equal(t, has, annotated, "function", name, "has used_memory")
				if annotated {
					check.Equal(t, aumInts(t, v), want, "used_memory of", name)
				}
			}
			check.Equal(t, aumFunc(t, got, "main").Attrs[AttrIOUsedMemory], any(tc.io), "io_used_memory")
			// The input is unchanged.
			_, had := aumFunc(t, mod, "main").Attrs[AttrIOUsedMemory]
			check.True(t, !had, "the pass modified its input")

			text := script.Print(got)
			golden := filepath.Join("testdata", "annotate_used_memory_"+tc.name+".golden")
			if annotateUsedMemoryUpdate() {
				check.NoError(t, os.WriteFile(golden, []byte(text), 0o644))
			}
			want, err := os.ReadFile(golden)
			check.NoError(t, err, "run with -update to create the golden")
			check.Equal(t, text, string(want), "printed module")
			again, err := script.Parse(golden, text)
			check.NoError(t, err, "parse the golden")
			check.True(t, ir.StructuralEqual(again, got), "the golden parses back to the annotated module")
		})
	}
}

// TestAnnotateUsedMemoryAfterFuseOps runs the pass by name where it
// belongs, after FuseOps, on the IRModule tutorial's MLP (as imported from PyTorch):
// main calls fused_matmul_add_relu while the 784×256 transposed weight,
// the input, fc1_bias, its result and the still-unused fc2 weights are
// live, then fused_matmul1_add1.
func TestAnnotateUsedMemoryAfterFuseOps(t *testing.T) {
	path := filepath.Join("..", "..", "script", "testdata", "001_from_torch.py")
	src, err := os.ReadFile(path)
	check.NoError(t, err)
	mod, err := script.Parse(path, string(src))
	check.NoError(t, err)
	got, err := Run(mod, []string{"LegalizeOps", "AnnotateTIROpPattern", "FoldConstant", "FuseOps", "AnnotateUsedMemory"})
	check.NoError(t, err)
	const f32 = 4
	want := map[string][]int64{
		// inp_0, transpose(fc1_weight), fc1_bias, result; fc2_bias, fc2_weight
		"fused_matmul_add_relu": {f32 * (784 + 784*256 + 256 + 256 + 10 + 10*256)},
		// lv (1, 256), transpose(fc2_weight), fc2_bias, result
		"fused_matmul1_add1": {f32 * (256 + 256*10 + 10 + 10)},
	}
	for name, w := range want {
		check.Equal(t, aumInts(t, aumFunc(t, got, name).Attrs[AttrUsedMemory]), w, name)
	}
	io := int64(f32 * (784 + 256 + 256*784 + 10 + 10*256 + 10))
	check.Equal(t, aumFunc(t, got, "main").Attrs[AttrIOUsedMemory], any(io), "io_used_memory")
}

func aumInts(t *testing.T, v any) []int64 {
	t.Helper()
	list, ok := v.([]any)
	check.True(t, ok, "used_memory is a list, got", v)
	out := make([]int64, 0, len(list))
	for _, x := range list {
		n, ok := x.(int64)
		check.True(t, ok, "used_memory entry is an int64, got", x)
		out = append(out, n)
	}
	return slices.Clip(out)
}

func aumFunc(t *testing.T, m *ir.IRModule, name string) *ir.Function {
	t.Helper()
	f, ok := m.Lookup(name)
	check.True(t, ok, "no function", name)
	fn, ok := f.(*ir.Function)
	check.True(t, ok, name, "is not a graph function")
	return fn
}
