package auto

import (
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/schedule"
	"github.com/kiln-ml/kiln/internal/check"
)

// TestRuleLists: the CPU and GPU rules are ordered lists of named rules,
// the CPU's in the order the Rule constants document.
func TestRuleLists(t *testing.T) {
	var cpu, gpu []string
	for _, r := range cpuRules {
		cpu = append(cpu, r.name)
	}
	for _, r := range gpuRules {
		gpu = append(gpu, r.name)
	}
	check.Equal(t, cpu, []string{RuleMatmul, RuleConvStem, RulePointwise, RuleConv, RuleGlobalPool, RulePoolRows,
		RulePointwise, RuleDepthwisePlane, RuleRowConv, RuleRowPipeline, RuleGeneric})
	check.Equal(t, gpu, []string{"row reduction", "row pipeline", "tensor-core matmul", "shared-memory matmul", "matmul", "fallback"})
}

// TestApplyRules: a rule that does not apply passes to the next; the
// first that applies wins and the rest are not tried; an error stops the
// list and is returned with the rule's name, never taken for "does not
// apply".
func TestApplyRules(t *testing.T) {
	f := parseFunc(t, fusedDense(4, 32, 8, false))
	var tried []string
	r := func(name string, g *ir.PrimFunc, ok bool, err error) rule[int] {
		return rule[int]{name, func(int) (*scheduled, bool, error) {
			tried = append(tried, name)
			if g == nil {
				return nil, ok, err
			}
			return &scheduled{f: g}, ok, err
		}}
	}
	g, name, _, err := applyRules([]rule[int]{r("a", nil, false, skip("not a")), r("b", nil, false, nil), r("c", f, true, nil), r("d", f, true, nil)}, 0, "cpu")
	check.NoError(t, err)
	check.Equal(t, name, "c")
	check.True(t, g.f == f)
	check.Equal(t, strings.Join(tried, ","), "a,b,c")

	tried = nil
	_, _, _, err = applyRules([]rule[int]{r("a", nil, false, skip("not a")), r("broken", nil, false, errors.New("split: factor 0")), r("c", f, true, nil)}, 0, "cpu")
	check.Error(t, err, `cpu rule "broken": split: factor 0`)
	check.Equal(t, strings.Join(tried, ","), "a,broken")

	_, name, last, err := applyRules([]rule[int]{r("a", nil, false, nil), r("b", nil, false, skip("rows of 3"))}, 0, "gpu")
	check.NoError(t, err)
	check.Equal(t, name, "")
	check.Error(t, last, "rows of 3")

	_, _, _, err = applyRules([]rule[int]{r("empty", nil, true, nil)}, 0, "gpu")
	check.Error(t, err, `gpu rule "empty": applied without a function`)

	// A rule's wrapped "does not apply" still is one.
	check.True(t, skipped(errors.Join(errors.New("block"), skip("x"))))
	check.True(t, !skipped(errors.New("x")))
}

// TestRegistersBoundTheTile: the matmul and convolution tiles keep their
// accumulators to three quarters of the target's vector registers, so 16
// registers of 64 bytes give a smaller tile than 32 and the result stays
// the unscheduled function's.
func TestRegistersBoundTheTile(t *testing.T) {
	f := parseFunc(t, fusedDense(16, 256, 8, false))
	accs := func(regs int64) int64 {
		g, rule, err := FuncRule(f, Options{VectorBytes: 64, VectorRegisters: regs})
		check.NoError(t, err)
		check.Equal(t, rule, RuleMatmul)
		sameOutput(t, f, g, 1e-5)
		// The tile: the unrolled and vectorized loops around the
		// accumulator's update (a store to the local buffer that
		// reads it).
		var n int64
		var walk func(nd ir.Node, tile int64)
		walk = func(nd ir.Node, tile int64) {
			ir.Visit(nd, func(m ir.Node) bool {
				switch m := m.(type) {
				case *ir.For:
					e, _ := ir.IsConstInt(m.Extent)
					if m.Kind == ir.ForUnrolled || m.Kind == ir.ForVectorized {
						walk(m.Body, tile*e)
					} else {
						walk(m.Body, tile)
					}
					return false
				case *ir.BufferStore:
					if m.Buffer.StorageScope() == "local" && strings.Contains(m.Value.String(), m.Buffer.Name) {
						n = max(n, tile)
					}
				}
				return true
			})
		}
		walk(g.Body, 1)
		return n / 16 // float32 lanes of a 64-byte vector
	}
	big, small := accs(32), accs(16)
	t.Logf("accumulator vectors: %d with 32 registers, %d with 16", big, small)
	check.True(t, big <= 24 && small <= 12 && small < big, "accumulator vectors: "+strconv.FormatInt(big, 10)+" with 32 registers, "+strconv.FormatInt(small, 10)+" with 16")
}

// TestAppliedTracesReplay: for every test function of every CPU rule, the
// trace Apply returns replays on the unscheduled function to the
// scheduled one.
func TestAppliedTracesReplay(t *testing.T) {
	type named struct {
		name string
		f    *ir.PrimFunc
		opts Options
	}
	var fs []named
	for _, cs := range [][]convCase{convCases(), planeCases(), stemCases()} {
		for _, cc := range cs {
			fs = append(fs, named{cc.name, cc.primFunc(t), cc.opts})
		}
	}
	for _, pc := range poolCases() {
		fs = append(fs, named{"pool_" + pc.name, pc.primFunc(t), Options{}})
	}
	for _, gc := range genericCases() {
		fs = append(fs, named{"generic_" + gc.name, gc.f(t), gc.opts})
	}
	for i, f := range rowPipelineCases(t) {
		fs = append(fs, named{"rows_" + strconv.Itoa(i), f, Options{}})
	}
	fs = append(fs, named{"dense", parseFunc(t, fusedDense(4, 32, 8, false)), Options{}},
		named{"global_pool", globalPoolFunc(t, [4]int64{1, 6, 7, 7}, false), Options{ParallelFlops: 1}})
	rules := map[string]int{}
	for _, n := range fs {
		a, err := Apply(n.f, n.opts)
		check.NoError(t, err)
		if a.Rule == "" {
			continue
		}
		rules[a.Rule]++
		r, err := schedule.Replay(n.f, a.Trace)
		if err != nil {
			t.Fatalf("%s (rule %q): the trace does not replay: %v\n%s", n.name, a.Rule, err, strings.Join(a.Trace, "\n"))
		}
		if !ir.StructuralEqual(r.Func(), a.Func) {
			t.Fatalf("%s (rule %q): the replayed trace gives another function", n.name, a.Rule)
		}
	}
	for _, want := range []string{RuleMatmul, RuleConv, RulePointwise, RuleDepthwisePlane, RuleGlobalPool, RulePoolRows, RuleRowPipeline, RuleGeneric} {
		check.True(t, rules[want] > 0, "no test function took rule ", want)
	}
}
