package tune

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"

	"github.com/kiln-ml/kiln/compiler/ir"
	relaxtransform "github.com/kiln-ml/kiln/compiler/relax/transform"
	"github.com/kiln-ml/kiln/compiler/tune/rules"
)

// The graph-level layout choices: every convolution signature of a model
// (a relaxtransform.LayoutSite) can take its kernel in several layouts
// (blocks of 32, 16 or 8 output channels, HWIO, OIHW), every dense layer
// signature its weight (panels of several widths, or as it is), and each
// layout makes other kernels of the operator and what fuses with it. The
// kernels of every layout are tasks; a site's cost is its cheapest
// layout's (the sum of calls × best time over that layout's kernels), and
// a build with the database takes, for each site, the layout whose
// kernels' best records add up to the least (ChooseLayouts).

// Lowering lowers a model with the given layouts (a site's Key to its
// layout; nil: the defaults), as compiler.GraphPipeline does, and lists
// its sites (compiler.LayoutLowering makes it).
type Lowering = relaxtransform.Lowering

// LayoutVariant is one layout of one site.
type LayoutVariant struct {
	// Site is the site's signature (relaxtransform.LayoutSite.Key),
	// Layout the layout; Default says it is the site's layout without a
	// choice.
	Site, Layout string
	Default      bool
	// Kernels are the workload hashes of the kernels that compute the
	// site's operators in this layout, with their calls per run.
	Kernels map[string]int
}

// LayoutTasks returns the tasks of a module with graph functions lowered
// by lower (the graph pipeline with a layout choice): the tasks of the
// module lowered with the default layouts (as Tasks gives them), then the
// kernels each other layout of each of lower's sites makes, which the
// default lowering lacks. Tasks of a site's kernels
// carry its Site and Layout. variants are the layouts of every site with
// more than one whose kernels are all tasks.
func LayoutTasks(lower *Lowering, target rules.Target, shape map[string]int64) (tasks []*Task, skipped []string, variants []LayoutVariant, err error) {
	base, err := lower.Lower(nil)
	if err != nil {
		return nil, nil, nil, err
	}
	if tasks, skipped, err = Tasks(base, target, shape); err != nil {
		return nil, nil, nil, err
	}
	var sites []relaxtransform.LayoutSite
	for _, s := range lower.Sites {
		if len(s.Layouts) > 1 && len(s.Sources) > 0 {
			sites = append(sites, s)
		}
	}
	byHash := map[string]*Task{}
	for _, t := range tasks {
		byHash[t.Workload.Hash] = t
	}
	// in counts the variants each task is a kernel of: one common to
	// several is no part of a choice.
	in := map[*Task]int{}
	ranks := 0
	for _, s := range sites {
		ranks = max(ranks, len(s.Layouts))
	}
	for r := 0; r < ranks; r++ {
		lowered, ts := base, tasks
		if r > 0 {
			choice := map[string]string{}
			for _, s := range sites {
				if r < len(s.Layouts) {
					choice[s.Key] = s.Layouts[r]
				}
			}
			if lowered, err = lower.Lower(choice); err != nil {
				return nil, nil, nil, fmt.Errorf("kernel layouts of rank %d: %w", r+1, err)
			}
			if ts, _, err = Tasks(lowered, target, shape); err != nil {
				return nil, nil, nil, fmt.Errorf("kernel layouts of rank %d: %w", r+1, err)
			}
		}
		byFunc := map[string]*Task{}
		for _, t := range ts {
			for _, f := range t.Funcs {
				byFunc[f] = t
			}
		}
		sources := kernelSources(lowered)
		for _, s := range sites {
			if r >= len(s.Layouts) {
				continue
			}
			v := LayoutVariant{Site: s.Key, Layout: s.Layouts[r], Default: r == 0, Kernels: map[string]int{}}
			var kernels []*Task
			complete := true
			for _, f := range slices.Sorted(maps.Keys(sources)) {
				if !slices.ContainsFunc(sources[f], func(src ir.Source) bool { return slices.Contains(s.Sources, src) }) {
					continue
				}
				t := byFunc[f]
				if t == nil {
					complete = false
					break
				}
				kernels = append(kernels, t)
			}
			if !complete || len(kernels) == 0 {
				if r > 0 {
					skipped = append(skipped, fmt.Sprintf("%s in %s: a kernel of it cannot be tuned: not searched", s.Key, v.Layout))
				}
				continue
			}
			for _, t := range kernels {
				if known := byHash[t.Workload.Hash]; known != nil {
					t = known
				} else {
					// Named apart from the default lowering's kernel of
					// the same name (the name is its symbol when built).
					t.Name = t.Name + "_" + strings.ToLower(v.Layout)
					t.Funcs[0] = t.Name
					byHash[t.Workload.Hash] = t
					tasks = append(tasks, t)
				}
				t.Site, t.Layout, t.SiteDefault = v.Site, v.Layout, v.Default
				in[t]++
				v.Kernels[t.Workload.Hash] = t.Weight
			}
			variants = append(variants, v)
		}
	}
	for t, n := range in {
		if n > 1 {
			t.Site, t.Layout, t.SiteDefault = "", "", false
		}
	}
	return tasks, skipped, variants, nil
}

// kernelSources maps each function mod's graph functions call (run per
// call, as CallCounts counts them) to the model operators of its calls.
func kernelSources(mod *ir.IRModule) map[string][]ir.Source {
	out := map[string][]ir.Source{}
	for _, fn := range mod.Funcs() {
		e, ok := fn.(ir.RExpr)
		if !ok || callCached(e) {
			continue
		}
		ir.RVisit(e, func(n ir.RExpr) bool {
			c, ok := n.(*ir.RCall)
			if !ok || len(c.Sources) == 0 {
				return true
			}
			for _, a := range append([]ir.RExpr{c.Op}, c.Args...) {
				if g, ok := a.(*ir.GlobalVar); ok && mod.PrimFunc(g.Name) != nil {
					out[g.Name] = ir.AddSources(out[g.Name], c.Sources...)
				}
			}
			return true
		})
	}
	return out
}

// LayoutChoice is the layout ChooseLayouts took for a site, with the
// estimated time per run of its kernels in it and in the default layout;
// HeadToHead says the times are a layout head-to-head's (see
// Record.LayoutPair), not the best records'.
type LayoutChoice struct {
	Site           string  `json:"site"`
	Layout         string  `json:"layout"`
	DefaultLayout  string  `json:"default_layout"`
	Seconds        float64 `json:"seconds"`
	DefaultSeconds float64 `json:"default_seconds"`
	HeadToHead     bool    `json:"head_to_head,omitempty"`
	// Other is the fastest layout but the default (the head-to-head's
	// other one), with its time.
	Other        string  `json:"other_layout,omitempty"`
	OtherSeconds float64 `json:"other_seconds,omitempty"`
}

// ChooseLayouts returns, for every site whose default layout db has a
// valid record for each kernel of, the layout whose kernels add up to the
// least time per run (calls × median): by the latest layout head-to-head
// of the site's layouts where it had one, else by the kernels' best
// records; with what each choice weighed.
func ChooseLayouts(variants []LayoutVariant, db *Database) (map[string]string, []LayoutChoice) {
	choice := map[string]string{}
	var out []LayoutChoice
	var order []string
	bySite := map[string][]LayoutVariant{}
	for _, v := range variants {
		if bySite[v.Site] == nil {
			order = append(order, v.Site)
		}
		bySite[v.Site] = append(bySite[v.Site], v)
	}
	for _, site := range order {
		vs := bySite[site]
		c := LayoutChoice{Site: site, Seconds: math.Inf(1), DefaultSeconds: math.Inf(1)}
		costs := make([]float64, len(vs))
		for i, v := range vs {
			costs[i] = bestCost(v, db)
		}
		if id := latestLayoutPair(vs, db); id != 0 {
			c.HeadToHead = true
			for i, v := range vs {
				costs[i] = pairCost(v, db, id)
			}
		}
		for i, v := range vs {
			if v.Default {
				c.DefaultLayout, c.DefaultSeconds = v.Layout, costs[i]
			} else if !math.IsInf(costs[i], 1) && (c.Other == "" || costs[i] < c.OtherSeconds) {
				c.Other, c.OtherSeconds = v.Layout, costs[i]
			}
			if costs[i] < c.Seconds {
				c.Layout, c.Seconds = v.Layout, costs[i]
			}
		}
		if math.IsInf(c.DefaultSeconds, 1) || c.Layout == "" {
			continue
		}
		choice[site] = c.Layout
		out = append(out, c)
	}
	return choice, out
}

// bestCost is v's kernels' calls × best record's median, summed (+Inf
// when one has no valid record).
func bestCost(v LayoutVariant, db *Database) float64 {
	cost := 0.0
	for h, calls := range v.Kernels {
		r, ok := db.Best(h)
		if !ok {
			return math.Inf(1)
		}
		cost += float64(calls) * r.Median()
	}
	return cost
}

// pairCost is bestCost by the records of layout head-to-head id, each
// kernel's time the median over its rounds (+Inf when it did not time
// every kernel of v).
func pairCost(v LayoutVariant, db *Database, id int64) float64 {
	cost := 0.0
	for h, calls := range v.Kernels {
		var times []float64
		for _, r := range db.Records(h) {
			if r.LayoutPair == id && r.Valid() {
				times = append(times, r.Median())
			}
		}
		if len(times) == 0 {
			return math.Inf(1)
		}
		slices.Sort(times)
		cost += float64(calls) * times[len(times)/2]
	}
	return cost
}

// latestLayoutPair is the latest layout head-to-head that timed every
// kernel of two or more of a site's layouts vs, 0 when none did.
func latestLayoutPair(vs []LayoutVariant, db *Database) int64 {
	ids := map[int64]bool{}
	for _, v := range vs {
		for h := range v.Kernels {
			for _, r := range db.Records(h) {
				if r.LayoutPair != 0 {
					ids[r.LayoutPair] = true
				}
			}
		}
	}
	for _, id := range slices.Backward(slices.Sorted(maps.Keys(ids))) {
		n := 0
		for _, v := range vs {
			if !math.IsInf(pairCost(v, db, id), 1) {
				n++
			}
		}
		if n >= 2 {
			return id
		}
	}
	return 0
}

// VariantsOf is the layout variants tasks are kernels of (by their Site
// and Layout, see LayoutTasks), as LayoutTasks lists them.
func VariantsOf(tasks []*Task) []LayoutVariant {
	var out []LayoutVariant
	at := map[[2]string]int{}
	for _, t := range tasks {
		if t.Site == "" {
			continue
		}
		k := [2]string{t.Site, t.Layout}
		i, ok := at[k]
		if !ok {
			i, at[k] = len(out), len(out)
			out = append(out, LayoutVariant{Site: t.Site, Layout: t.Layout, Default: t.SiteDefault, Kernels: map[string]int{}})
		}
		out[i].Kernels[t.Workload.Hash] = t.Weight
	}
	return out
}

// LayoutChooser is the layout choice of a build with db (a
// compiler.BuildOptions.Layouts): it lowers the model with every layout
// of every site (LayoutTasks) and takes ChooseLayouts' choice, calling
// report, when set, with each site's.
func LayoutChooser(db *Database, target rules.Target, shape map[string]int64, report func(LayoutChoice)) func(*Lowering) (map[string]string, error) {
	return func(lower *Lowering) (map[string]string, error) {
		_, _, variants, err := LayoutTasks(lower, target, shape)
		if err != nil {
			return nil, err
		}
		choice, made := ChooseLayouts(variants, db)
		if report != nil {
			for _, c := range made {
				report(c)
			}
		}
		return choice, nil
	}
}
