package tune

import (
	"context"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/kiln-ml/kiln/compiler"
	"github.com/kiln-ml/kiln/compiler/frontend/onnx"
	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/tune/rules"
	"github.com/kiln-ml/kiln/internal/check"
)

// TestLayoutTasks lowers the three-convolution model with every kernel
// layout of its two convolution sites (8 → 8 channels twice, 8 → 16):
// the default lowering's tasks come first, the other layouts' kernels
// after them, named apart, and every task of a site names its layout; a
// database whose records make a layout the cheapest has ChooseLayouts
// take it, a site whose default layout has no record keeps its default,
// and the build with that choice has the chosen layout's kernels.
func TestLayoutTasks(t *testing.T) {
	mod, target, rt, lower := modelLowering(t, twoConvModel(t))
	tasks, _, variants, err := LayoutTasks(lower, rt, nil)
	check.NoError(t, err)
	base, err := compiler.GraphPipeline(mod, target, "", false, nil)
	check.NoError(t, err)
	plain, _, err := Tasks(base, rt, nil)
	check.NoError(t, err)
	for i, p := range plain {
		check.Equal(t, tasks[i].Workload.Hash, p.Workload.Hash, "the default lowering's tasks come first")
	}
	check.True(t, len(tasks) > len(plain), len(tasks))
	names := map[string]bool{}
	for _, tk := range tasks {
		check.True(t, !names[tk.Name], "two tasks named", tk.Name)
		names[tk.Name] = true
		check.True(t, tk.Site != "", tk.Name, "is a kernel of a convolution site")
		if !tk.SiteDefault {
			check.True(t, strings.HasSuffix(tk.Name, "_"+strings.ToLower(tk.Layout)), tk.Name)
		}
	}
	sites := map[string][]LayoutVariant{}
	for _, v := range variants {
		sites[v.Site] = append(sites[v.Site], v)
	}
	check.Equal(t, len(sites), 2, sites)
	eight := "conv2d 1x8x8x8 * 8x8x3x3 strides 1,1 padding 1,1,1,1 dilation 1,1"
	sixteen := "conv2d 1x8x8x8 * 16x8x3x3 strides 1,1 padding 1,1,1,1 dilation 1,1"
	check.Equal(t, len(sites[eight]), 3, "OIHW8o, HWIO, OIHW")
	check.Equal(t, len(sites[sixteen]), 4, "OIHW16o, OIHW8o, HWIO, OIHW")
	for _, v := range sites[eight] {
		for _, calls := range v.Kernels {
			check.Equal(t, calls, 2, "both 8 → 8 layers call the kernel", v.Layout)
		}
	}

	// Records: every layout of the 8 → 8 site measured, HWIO the
	// cheapest; only the non-default layouts of the other.
	db := NewDatabase(target.String())
	timed := func(hash string, s float64) {
		db.add(Record{Workload: Workload{Hash: hash}, Target: target.String(), Times: []float64{s}})
	}
	want := map[string]float64{}
	for _, v := range variants {
		for h := range v.Kernels {
			switch {
			case v.Site == eight && v.Layout == "HWIO":
				timed(h, 1e-6)
				want[v.Layout] = 2e-6
			case v.Site == eight:
				timed(h, 3e-6)
			case !v.Default:
				timed(h, 1e-7)
			}
		}
	}
	choice, made := ChooseLayouts(variants, db)
	check.Equal(t, len(choice), 1, choice)
	check.Equal(t, choice[eight], "HWIO")
	check.Equal(t, len(made), 1)
	check.Equal(t, made[0].DefaultLayout, sites[eight][0].Layout)
	check.True(t, math.Abs(made[0].Seconds-want["HWIO"]) < 1e-12, made[0])
	check.True(t, math.Abs(made[0].DefaultSeconds-6e-6) < 1e-12, made[0])

	chosen, err := LayoutChooser(db, rt, nil, nil)(lower)
	check.NoError(t, err)
	check.Equal(t, chosen[eight], "HWIO")
	built, err := lower.Lower(chosen)
	check.NoError(t, err)
	got, _, err := Tasks(built, rt, nil)
	check.NoError(t, err)
	hwio := map[string]bool{}
	for _, v := range sites[eight] {
		if v.Layout == "HWIO" {
			for h := range v.Kernels {
				hwio[h] = true
			}
		}
	}
	found := 0
	for _, tk := range got {
		if hwio[tk.Workload.Hash] {
			found++
		}
	}
	check.Equal(t, found, len(hwio), "the build with the choice has the HWIO kernels")
}

// TestLatencyCountsCheapestLayout: a convolution site counts once in the
// model's estimate, at its cheapest fully measured layout (at its
// default layout for the default estimate), and pick's gradient for a
// kernel of a layout far costlier than the site's cheapest is 0.
func TestLatencyCountsCheapestLayout(t *testing.T) {
	p := Progress{Tasks: []TaskSummary{
		{Name: "relu", Weight: 1, Best: 1, Default: 2},
		{Name: "conv", Weight: 2, Best: 4, Default: 5, Site: "s", Layout: "A", SiteDefault: true},
		{Name: "conv_b", Weight: 2, Best: 1, Default: 3, Site: "s", Layout: "B"},
		{Name: "conv_b2", Weight: 1, Best: 1, Default: 1, Site: "s", Layout: "B"},
		{Name: "conv_c", Weight: 1, Best: 0, Site: "s", Layout: "C"},
	}}
	best, dflt := p.Latency()
	check.Equal(t, best, 1.0+3)
	check.Equal(t, dflt, 2.0+10)

	task := func(name, layout string, w int) *Task {
		return &Task{Name: name, Weight: w, Site: "s", Layout: layout}
	}
	cheap := &taskState{task: task("b", "B", 1), best: 1, rounds: []float64{1}, launched: 1}
	dear := &taskState{task: task("a", "A", 1), best: 10, rounds: []float64{10}, launched: 1}
	other := &taskState{task: &Task{Name: "x", Weight: 1}, best: 0.5, rounds: []float64{0.5}, launched: 1}
	// The dear layout's own gradient (10) is the largest, but one more
	// round of it is not expected to bring it under the cheap one's 1.
	check.Equal(t, pick([]*taskState{dear, cheap, other}, nil), cheap)
}

// layoutDriftRunner times task "a" at 2 ms the first time (a busy
// moment) and, with hiccup, at 3 ms the second (the head-to-head's first
// round), at 1 ms after that; every other task at 1.5 ms.
type layoutDriftRunner struct {
	mu     sync.Mutex
	a      int
	hiccup bool
}

func (r *layoutDriftRunner) Stream(ctx context.Context, task *Task, cands []*Candidate, each func(int, Result)) error {
	for i := range cands {
		s := 1.5e-3
		if task.Name == "a" {
			r.mu.Lock()
			r.a++
			s = 1e-3
			switch {
			case r.a == 1:
				s = 2e-3
			case r.a == 2 && r.hiccup:
				s = 3e-3
			}
			r.mu.Unlock()
		}
		each(i, Result{Times: []float64{s}})
	}
	return nil
}

// TestLayoutHeadToHead: a site's default layout (kernel a) timed at a
// busy moment looks slower than its other layout (kernel b); the layout
// head-to-head at the end of the run times both again, one after the
// other, in layoutPairRounds rounds with one LayoutPair id, and
// ChooseLayouts keeps the default, saying it was a head-to-head, even
// when one round of it hit a hiccup (the median of the rounds decides);
// without one the drifted timing decides.
func TestLayoutHeadToHead(t *testing.T) {
	for _, c := range []struct{ h2h, hiccup bool }{{false, false}, {true, false}, {true, true}} {
		h2h := c.h2h
		a, b := siteTasks(t)
		db := NewDatabase("cpu")
		_, err := Tune(context.Background(), []*Task{a, b}, db, &layoutDriftRunner{hiccup: c.hiccup}, Options{Trials: 2, Batch: 1, Seed: 1, HeadToHead: h2h})
		check.NoError(t, err)
		choice, made := ChooseLayouts(VariantsOf([]*Task{a, b}), db)
		check.Equal(t, len(made), 1, made)
		pairs := 0
		for _, tk := range []*Task{a, b} {
			for _, r := range db.Records(tk.Workload.Hash) {
				if r.LayoutPair != 0 {
					pairs++
				}
			}
		}
		if !h2h {
			check.Equal(t, pairs, 0)
			check.Equal(t, choice["s"], "B", "without a head-to-head the drifted timing decides")
			continue
		}
		check.Equal(t, pairs, 2*layoutPairRounds)
		check.Equal(t, choice["s"], "A", "hiccup:", c.hiccup)
		check.Equal(t, made[0], LayoutChoice{Site: "s", Layout: "A", DefaultLayout: "A", Seconds: 1e-3, DefaultSeconds: 1e-3, HeadToHead: true, Other: "B", OtherSeconds: 1.5e-3})
	}
}

// TestDenseLayoutTasks: each dense layer of a model is a site whose
// weight layouts (panels of each width the dense rule takes, and the
// weight as it is) are tasks; the dense rule schedules every one of
// them, and the lowering with a layout chosen has that layout's kernels.
func TestDenseLayoutTasks(t *testing.T) {
	_, _, rt, lower := modelLowering(t, denseModel(t))
	tasks, skipped, variants, err := LayoutTasks(lower, rt, nil)
	check.NoError(t, err)
	for _, s := range skipped {
		check.True(t, strings.Contains(s, "once per set of weights"), "only the weights' packing is not tuned:", s)
	}
	sites := map[string][]string{}
	for _, v := range variants {
		sites[v.Site] = append(sites[v.Site], v.Layout)
	}
	check.Equal(t, len(sites), 2, sites)
	for _, s := range lower.Sites {
		check.True(t, strings.HasPrefix(s.Key, "dense 8x"), s.Key)
		check.Equal(t, strings.Join(sites[s.Key], " "), strings.Join(s.Layouts, " "), "every layout of", s.Key, "is a variant")
		check.True(t, slices.Contains(s.Layouts, "KN"), s.Key, "can keep its weight as it is")
	}
	for _, tk := range tasks {
		if tk.Site == "" {
			continue
		}
		c, err := tk.Space.Default()
		check.NoError(t, err)
		check.True(t, slices.ContainsFunc(c.Decisions, func(d Decision) bool { return strings.HasPrefix(d.Site, "matmul/") }),
			tk.Name, "in", tk.Layout, "is scheduled by the dense rule:", c.Decisions)
	}
	for _, v := range variants {
		built, err := lower.Lower(map[string]string{v.Site: v.Layout})
		check.NoError(t, err)
		got, _, err := Tasks(built, rt, nil)
		check.NoError(t, err)
		for h := range v.Kernels {
			check.True(t, slices.ContainsFunc(got, func(tk *Task) bool { return tk.Workload.Hash == h }), "the lowering with", v.Site, "in", v.Layout, "has its kernels")
		}
	}
}

// modelLowering imports an ONNX model and returns it, the host CPU target
// (and its tuning target) and the model's Lowering through O2, which has
// layout sites to choose.
func modelLowering(t *testing.T, model []byte) (*ir.IRModule, compiler.Target, rules.Target, *compiler.Lowering) {
	t.Helper()
	mod, _, err := onnx.ImportBytes("model.onnx", model, onnx.Options{})
	check.NoError(t, err)
	target, err := compiler.ParseTarget("cpu")
	check.NoError(t, err)
	rt, err := target.TuneTarget()
	check.NoError(t, err)
	lower := compiler.LayoutLowering(mod, target, "", false)
	check.True(t, lower != nil, "O2 chooses layouts")
	return mod, target, rt, lower
}

// aloneRunner is a layoutDriftRunner that can time candidates alone,
// counting the candidates timed so.
type aloneRunner struct {
	layoutDriftRunner
	alone int
}

func (r *aloneRunner) StreamAlone(ctx context.Context, task *Task, cands []*Candidate, each func(int, Result)) error {
	r.mu.Lock()
	r.alone += len(cands)
	r.mu.Unlock()
	return r.Stream(ctx, task, cands, each)
}

// TestHeadToHeadsTimeAlone: with a runner that can time candidates alone
// (an AloneRunner), the head-to-heads do, and the search does not.
func TestHeadToHeadsTimeAlone(t *testing.T) {
	a, b := siteTasks(t)
	db := NewDatabase("cpu")
	r := &aloneRunner{}
	_, err := Tune(context.Background(), []*Task{a, b}, db, r, Options{Trials: 2, Batch: 1, Seed: 1, HeadToHead: true})
	check.NoError(t, err)
	pairs := 0
	for _, tk := range []*Task{a, b} {
		for _, rec := range db.Records(tk.Workload.Hash) {
			if rec.LayoutPair != 0 || rec.Pair != 0 {
				pairs++
			}
		}
	}
	check.True(t, pairs > 0, "head-to-heads ran")
	check.Equal(t, r.alone, pairs, "every head-to-head timing, and no search timing, was alone")
}

// siteTasks are two matmul tasks, a and b, the default layout A and the
// layout B of one site "s".
func siteTasks(t *testing.T) (*Task, *Task) {
	t.Helper()
	a, err := NewTask("a", matmulFunc(t, 32, 32, 32), 1, testTarget)
	check.NoError(t, err)
	b, err := NewTask("b", matmulFunc(t, 32, 32, 16), 1, testTarget)
	check.NoError(t, err)
	a.Site, a.Layout, a.SiteDefault = "s", "A", true
	b.Site, b.Layout = "s", "B"
	return a, b
}
