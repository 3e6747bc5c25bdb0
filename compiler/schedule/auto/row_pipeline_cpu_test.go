package auto

import (
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/internal/check"
)

// rowPipelineCases are layer norms and softmaxes on rows the vectors
// divide and on odd ones.
func rowPipelineCases(t *testing.T) []*ir.PrimFunc {
	ln := func(shape ...int64) *ir.PrimFunc {
		k := shape[len(shape)-1]
		return legalized(t, "nn.layer_norm", map[string]any{"axes": []int64{-1}}, shape, []int64{k}, []int64{k})
	}
	return []*ir.PrimFunc{
		ln(1, 7, 5, 96), ln(3, 37), ln(2, 3, 1, 19),
		legalized(t, "nn.softmax", nil, []int64{4, 64}), legalized(t, "nn.softmax", nil, []int64{2, 5, 33}),
	}
}

// TestRowPipeline checks that the CPU rules give layer norms and
// softmaxes the row pipeline rule (one loop nest over the rows at the
// root, every block under it, parallel when the options call every
// nest big enough), and that the scheduled functions compute what the
// unscheduled ones do in the interpreter, before and after lowering.
func TestRowPipeline(t *testing.T) {
	for i, f := range rowPipelineCases(t) {
		for _, opts := range []Options{{ParallelFlops: 16}, {ParallelFlops: -1}} {
			g, rule, err := FuncRule(f, opts)
			check.NoError(t, err)
			check.Equal(t, rule, RuleRowPipeline, "case %d", i)
			check.NoError(t, ir.Verify(g))
			root := ir.RootBlock(g.Body)
			check.True(t, root != nil, "a root block")
			seq, isSeq := root.Body.(*ir.SeqStmt)
			check.True(t, !isSeq || len(seq.Seq) == 1, "case %d: one loop nest at the root", i)
			par, _ := loopKinds(g)
			want := 0
			if opts.ParallelFlops > 0 {
				want = 1
			}
			check.Equal(t, par, want, "case %d: parallel loops", i)
			sameOutput(t, f, g, 1e-5)
		}
	}
}

// TestRowPipelineCompiled runs the scheduled functions compiled to C
// against the unscheduled ones in the interpreter.
func TestRowPipelineCompiled(t *testing.T) {
	if testing.Short() {
		t.Skip("compiles C")
	}
	fs := rowPipelineCases(t)
	opts := make([]Options, len(fs))
	for i := range opts {
		opts[i] = Options{ParallelFlops: 16}
	}
	src, funcs := scheduledSource(t, "rows", fs, opts)
	checkCompiled(t, src, funcs)
}

// TestRowPipelineChoices schedules the layer norms and softmaxes under
// random choices (the parallel row loops, vector lanes, the vector of
// partial results) and checks each against the unscheduled function and
// its trace's replay; the rule applies whatever is drawn.
func TestRowPipelineChoices(t *testing.T) {
	asked := map[string]bool{}
	for _, f := range rowPipelineCases(t) {
		for _, s := range checkChoices(t, f, Options{ParallelFlops: 16}, 4) {
			asked[s[strings.LastIndex(s, "/")+1:]] = true
			check.True(t, strings.HasPrefix(s, RuleRowPipeline+"/"), "site", s)
		}
		a, err := Apply(f, drawnOpts(Options{ParallelFlops: 16}, 3))
		check.NoError(t, err)
		check.Equal(t, a.Rule, RuleRowPipeline)
	}
	for _, what := range []string{"parallel", "vector", "partials"} {
		check.True(t, asked[what], "no case asked for", what)
	}
}
