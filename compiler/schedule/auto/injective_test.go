package auto

import (
	"fmt"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/script"
	"github.com/kiln-ml/kiln/compiler/topi"
	"github.com/kiln-ml/kiln/internal/check"
)

// biasChain is FuseTIR's shape of (x + b) * s then relu over [m, n]: two
// intermediates the generic rule inlines into the last block.
func biasChain(m, n int) string {
	return fmt.Sprintf(`
@T.prim_func(private=True)
def chain(x: T.Buffer((T.int64(%[1]d), T.int64(%[2]d)), "float32"), b: T.Buffer((T.int64(%[2]d),), "float32"), s: T.Buffer((T.int64(%[1]d), T.int64(1)), "float32"), out: T.Buffer((T.int64(%[1]d), T.int64(%[2]d)), "float32")):
    T.func_attr({"tir.noalias": T.bool(True)})
    t0 = T.alloc_buffer((T.int64(%[1]d), T.int64(%[2]d)))
    t1 = T.alloc_buffer((T.int64(%[1]d), T.int64(%[2]d)))
    for i, j in T.grid(T.int64(%[1]d), T.int64(%[2]d)):
        with T.block("add"):
            v_i, v_j = T.axis.remap("SS", [i, j])
            t0[v_i, v_j] = x[v_i, v_j] + b[v_j]
    for i, j in T.grid(T.int64(%[1]d), T.int64(%[2]d)):
        with T.block("scale"):
            v_i, v_j = T.axis.remap("SS", [i, j])
            t1[v_i, v_j] = t0[v_i, v_j] * s[v_i, T.int64(0)]
    for i, j in T.grid(T.int64(%[1]d), T.int64(%[2]d)):
        with T.block("relu"):
            v_i, v_j = T.axis.remap("SS", [i, j])
            out[v_i, v_j] = T.max(t1[v_i, v_j], T.float32(0.0))
`, m, n)
}

// transposeReshape is attention's head merge: [h, s, d] → [s, h, d] →
// [s, h*d].
func transposeReshape(h, sq, d int) string {
	return fmt.Sprintf(`
@T.prim_func(private=True)
def merge(x: T.Buffer((T.int64(%[1]d), T.int64(%[2]d), T.int64(%[3]d)), "float32"), out: T.Buffer((T.int64(%[2]d), T.int64(%[4]d)), "float32")):
    T.func_attr({"tir.noalias": T.bool(True)})
    t = T.alloc_buffer((T.int64(%[2]d), T.int64(%[1]d), T.int64(%[3]d)))
    for a, b, c in T.grid(T.int64(%[2]d), T.int64(%[1]d), T.int64(%[3]d)):
        with T.block("T_transpose"):
            v_a, v_b, v_c = T.axis.remap("SSS", [a, b, c])
            t[v_a, v_b, v_c] = x[v_b, v_a, v_c]
    for a, b in T.grid(T.int64(%[2]d), T.int64(%[4]d)):
        with T.block("T_reshape"):
            v_a, v_b = T.axis.remap("SS", [a, b])
            out[v_a, v_b] = t[v_a, v_b // T.int64(%[3]d), v_b %% T.int64(%[3]d)]
`, h, sq, d, h*d)
}

func legalized(t *testing.T, op string, attrs map[string]any, shapes ...[]int64) *ir.PrimFunc {
	t.Helper()
	infos := make([]ir.StructInfo, len(shapes))
	for i, s := range shapes {
		infos[i] = ir.TensorOfShape(ir.Float32, s...)
	}
	r, err := topi.Build(op, infos, attrs)
	check.NoError(t, err)
	return r.Func
}

// loopKinds counts the parallel and vectorized loops of f.
func loopKinds(f *ir.PrimFunc) (parallel, vectorized int) {
	ir.Visit(f.Body, func(n ir.Node) bool {
		if l, ok := n.(*ir.For); ok {
			switch l.Kind {
			case ir.ForParallel:
				parallel++
			case ir.ForVectorized:
				vectorized++
			}
		}
		return true
	})
	return parallel, vectorized
}

// genericCase is a kernel for the generic rule; allocs are the root's
// buffers after scheduling, parallel and vectorized count the loops of
// each kind.
type genericCase struct {
	name                 string
	f                    func(t *testing.T) *ir.PrimFunc
	opts                 Options
	allocs               string
	parallel, vectorized int
	unchanged            bool
}

func genericCases() []genericCase {
	always := Options{ParallelFlops: 16} // every loop nest big enough
	return []genericCase{
		{name: "chain_inlined", f: func(t *testing.T) *ir.PrimFunc { return parseFunc(t, biasChain(5, 48)) },
			vectorized: 1},
		{name: "chain_parallel", f: func(t *testing.T) *ir.PrimFunc { return parseFunc(t, biasChain(3, 64)) },
			opts: always, parallel: 1, vectorized: 1},
		{name: "chain_odd_width", f: func(t *testing.T) *ir.PrimFunc { return parseFunc(t, biasChain(7, 13)) },
			opts: always, parallel: 1},
		// The reshape reads the transpose at divided indices: both stay,
		// each vectorized along its output's rows.
		{name: "head_merge", f: func(t *testing.T) *ir.PrimFunc { return parseFunc(t, transposeReshape(4, 6, 32)) },
			allocs: "t", vectorized: 2},
		// Softmax and layer norm take the row pipeline rule: one
		// parallel loop over the rows, every step of a row under it.
		{name: "softmax", f: func(t *testing.T) *ir.PrimFunc { return legalized(t, "nn.softmax", nil, []int64{3, 5, 32}) },
			opts: always, allocs: "T_softmax_maxelem T_softmax_exp T_softmax_expsum T_softmax_maxelem_rf T_softmax_expsum_rf", parallel: 1, vectorized: 6},
		// Rows too short for a vector, too little work for threads: the
		// steps of a row still run together.
		{name: "softmax_odd_small", f: func(t *testing.T) *ir.PrimFunc { return legalized(t, "nn.softmax", nil, []int64{3, 33}) },
			allocs: "T_softmax_maxelem T_softmax_exp T_softmax_expsum"},
		{name: "sum_rows", f: func(t *testing.T) *ir.PrimFunc {
			return legalized(t, "sum", map[string]any{"axis": []int64{1}}, []int64{6, 37})
		}, opts: always, parallel: 1},
		{name: "layer_norm", f: func(t *testing.T) *ir.PrimFunc {
			return legalized(t, "nn.layer_norm", map[string]any{"axes": []int64{-1}}, []int64{2, 3, 48}, []int64{48}, []int64{48})
		}, opts: always, allocs: "T_layer_norm_sum T_layer_norm_sqsum T_layer_norm_sum_rf T_layer_norm_sqsum_rf", parallel: 1, vectorized: 5},
		// Rows of 64: a vector of partial sums (maxima) per row.
		{name: "sum_rows_vector", f: func(t *testing.T) *ir.PrimFunc {
			return legalized(t, "sum", map[string]any{"axis": []int64{1}}, []int64{5, 64})
		}, vectorized: 2},
		{name: "max_rows_vector_parallel", f: func(t *testing.T) *ir.PrimFunc {
			return legalized(t, "max", map[string]any{"axis": []int64{-1}, "keepdims": true}, []int64{3, 2, 96})
		}, opts: always, parallel: 1, vectorized: 2},
		// The reduced axis is the middle one: its loop is still innermost,
		// its loads strided (gathered into vectors).
		{name: "sum_middle_axis", f: func(t *testing.T) *ir.PrimFunc {
			return legalized(t, "sum", map[string]any{"axis": []int64{1}}, []int64{2, 64, 3})
		}, vectorized: 2},
	}
}

// TestGeneric schedules the glue kernels with the generic rule and
// checks each against the unscheduled function in the interpreter,
// before and after lowering.
func TestGeneric(t *testing.T) {
	for _, tc := range genericCases() {
		t.Run(tc.name, func(t *testing.T) {
			f := tc.f(t)
			g, ok := scheduleChecked(t, f, tc.opts, !tc.unchanged)
			if !ok {
				return
			}
			if tc.allocs != "" {
				check.Equal(t, strings.Join(rootAllocs(g), " "), tc.allocs, "root buffers")
			} else if strings.HasPrefix(tc.name, "chain") {
				check.Equal(t, len(rootAllocs(g)), 0, "intermediates inlined")
			}
			par, vec := loopKinds(g)
			check.Equal(t, [2]int{par, vec}, [2]int{tc.parallel, tc.vectorized}, "parallel and vectorized loops")
			sameOutput(t, f, g, 1e-6)
		})
	}
}

// TestGenericLeavesScheduled: a function with a scheduled loop (here a
// parallel one, as a tuning record leaves it) is not touched.
func TestGenericLeavesScheduled(t *testing.T) {
	src := strings.Replace(biasChain(4, 32), "for i, j in T.grid(T.int64(4), T.int64(32)):\n        with T.block(\"scale\")",
		"for i in T.parallel(T.int64(4)):\n      for j in range(T.int64(32)):\n        with T.block(\"scale\")", 1)
	f := parseFunc(t, src)
	check.True(t, strings.Contains(script.Print(f), "T.parallel"), "the test's function has a parallel loop")
	scheduleChecked(t, f, Options{}, false)
}

// TestGenericCompiled compiles the scheduled kernels to C and runs them
// against the unscheduled functions in the interpreter.
func TestGenericCompiled(t *testing.T) {
	if testing.Short() {
		t.Skip("compiles C")
	}
	var fs []*ir.PrimFunc
	var opts []Options
	for _, tc := range genericCases() {
		if !tc.unchanged {
			fs, opts = append(fs, tc.f(t)), append(opts, tc.opts)
		}
	}
	src, funcs := scheduledSource(t, "generic", fs, opts)
	checkCompiled(t, src, funcs)
}

// TestGenericChoices schedules the glue kernels under random choices
// (inlining, vector lanes, parallel loops, the vector of partial
// results) and checks each against the unscheduled function and its
// trace's replay.
func TestGenericChoices(t *testing.T) {
	asked := map[string]bool{}
	for _, tc := range genericCases() {
		t.Run(tc.name, func(t *testing.T) {
			for _, s := range checkChoices(t, tc.f(t), tc.opts, 4) {
				asked[s[:strings.Index(s, "/")]+"/"+s[strings.LastIndex(s, "/")+1:]] = true
			}
		})
	}
	for _, site := range []string{RuleGeneric + "/inline", RuleGeneric + "/vector", RuleGeneric + "/parallel", RuleGeneric + "/partials",
		RuleRowPipeline + "/parallel", RuleRowPipeline + "/vector", RuleRowPipeline + "/partials"} {
		check.True(t, asked[site], "no case asked for", site)
	}
}

// TestGenericChoicesCompiled compiles the glue kernels scheduled under
// random choices (three draws of each) to C and checks them against the
// interpreter.
func TestGenericChoicesCompiled(t *testing.T) {
	if testing.Short() {
		t.Skip("compiles C")
	}
	var fs []*ir.PrimFunc
	var opts []Options
	for _, tc := range genericCases() {
		fs, opts = append(fs, tc.f(t)), append(opts, tc.opts)
	}
	checkDrawnCompiled(t, "generic_drawn", fs, opts, 3)
}
