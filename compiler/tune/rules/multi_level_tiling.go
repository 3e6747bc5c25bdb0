package rules

import (
	"fmt"
	"slices"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/schedule"
)

// multiLevelTiling tiles a reduction block's loops in MetaSchedule's
// "SSRSRS" structure for CPUs: every spatial loop is split into four
// levels (S0 S1 S2 S3) and every reduction loop into two (R0 R1), then
// the loops run S0 S1 R0 S2 R1 S3, so that the S2·S3 tile of the output
// is reused across the reduction. Choices:
//
//   - the tile factors of every loop (sample_perfect_tile; the innermost
//     spatial loop's last factor is at most a vector register's lanes
//     times four, the others' at most 16);
//   - the order of the spatial loops at the outermost level (as written,
//     or reversed: j before i, so a panel of B stays in cache);
//   - where the output accumulates (cache_write "local"): nowhere, or at
//     the end of the S1 or the S0 level, written back there
//     (reverse_compute_at);
//   - for each input whose innermost index follows the innermost spatial
//     loop (B of a matmul), whether to copy the panel the outermost loop
//     reads (cache_read "global" computed at that loop).
//
// Only blocks with reuse are tiled: some input is read again across a
// spatial loop (A across j and B across i in a matmul). The reduction's
// init is split off at R0 (decompose_reduction), so the
// accumulators are set once per tile. Blocks whose loops were transformed
// already, or have symbolic extents, are left alone.
type multiLevelTiling struct{}

func init() { Register(multiLevelTiling{}, "cpu") }

func (multiLevelTiling) Name() string { return "multi_level_tiling" }
func (multiLevelTiling) Order() int   { return 20 }

func (multiLevelTiling) Apply(c *Context, s *schedule.Schedule) error {
	for _, name := range blockNames(s.Func()) {
		b, err := s.GetBlock(name)
		if err != nil {
			continue
		}
		br, err := s.BlockRealize(b)
		if err != nil || br.Block.Init == nil || len(br.Block.Writes) != 1 {
			continue
		}
		loops, kinds, _, ok := loopKinds(s, b)
		if !ok || !slices.Contains(kinds, ir.IterSpatial) || !slices.Contains(kinds, ir.IterReduce) || !hasReuse(br.Block) {
			continue
		}
		if err := tileBlock(c, s, name, b, br, loops, kinds); err != nil {
			return fmt.Errorf("%s of block %q: %w", "multi_level_tiling", name, err)
		}
	}
	return nil
}

func tileBlock(c *Context, s *schedule.Schedule, name string, b schedule.BlockRV, br *ir.BlockRealize, loops []schedule.LoopRV, kinds []ir.IterKind) error {
	out := br.Block.Writes[0].Buffer
	lanes := c.Target.Lanes(out.DType)
	lastSpatial := -1
	for i, k := range kinds {
		if k == ir.IterSpatial {
			lastSpatial = i
		}
	}
	var levels [6][]schedule.LoopRV // S0 S1 R0 S2 R1 S3
	for i, l := range loops {
		site := fmt.Sprintf("tile/%s/%s", name, l)
		if kinds[i] == ir.IterSpatial {
			maxInner := int64(16)
			if i == lastSpatial {
				maxInner = 4 * lanes
			}
			f, err := c.Sampler.Tile(s, site, l, 4, maxInner)
			if err != nil {
				return err
			}
			parts, err := s.Split(l, f...)
			if err != nil {
				return err
			}
			levels[0] = append(levels[0], parts[0])
			levels[1] = append(levels[1], parts[1])
			levels[3] = append(levels[3], parts[2])
			levels[5] = append(levels[5], parts[3])
			continue
		}
		f, err := c.Sampler.Tile(s, site, l, 2, 64)
		if err != nil {
			return err
		}
		parts, err := s.Split(l, f...)
		if err != nil {
			return err
		}
		levels[2] = append(levels[2], parts[0])
		levels[4] = append(levels[4], parts[1])
	}
	if len(levels[0]) > 1 {
		rev, err := c.Sampler.Choose(s, fmt.Sprintf("outer_order/%s", name), 2, nil)
		if err != nil {
			return err
		}
		if rev == 1 {
			slices.Reverse(levels[0])
		}
	}
	var order []schedule.LoopRV
	for _, lv := range levels {
		order = append(order, lv...)
	}
	if err := s.Reorder(order...); err != nil {
		return err
	}
	at, err := c.Sampler.Choose(s, fmt.Sprintf("cache_write/%s", name), 3, []float64{1, 2, 2})
	if err != nil {
		return err
	}
	if at > 0 {
		wb, err := s.CacheWrite(b, 0, "local")
		if err != nil {
			return err
		}
		lv := levels[1]
		if at == 2 {
			lv = levels[0]
		}
		if err := s.ReverseComputeAt(wb, lv[len(lv)-1]); err != nil {
			return err
		}
	}
	if _, err := s.DecomposeReduction(b, levels[2][0]); err != nil {
		return err
	}
	// Panels of inputs whose innermost index follows the innermost
	// spatial loop.
	spatialVar := br.Block.IterVars[iterIndex(br, loops[lastSpatial])].Var
	for _, r := range br.Block.Reads {
		if !isParamBuffer(s.Func(), r.Buffer) || len(r.Region) == 0 || r.Buffer == out {
			continue
		}
		if !usesVar(r.Region[len(r.Region)-1].Min, spatialVar) {
			continue
		}
		pack, err := c.Sampler.Choose(s, fmt.Sprintf("cache_read/%s/%s", name, r.Buffer.Name), 2, nil)
		if err != nil {
			return err
		}
		if pack == 0 {
			continue
		}
		cur, err := s.BlockRealize(b)
		if err != nil {
			return err
		}
		idx := slices.IndexFunc(cur.Block.Reads, func(x ir.BufferRegion) bool { return x.Buffer == r.Buffer })
		if idx < 0 {
			return fmt.Errorf("block no longer reads %q", r.Buffer.Name)
		}
		rb, err := s.CacheRead(b, idx, "global")
		if err != nil {
			return err
		}
		if err := s.ComputeAt(rb, levels[0][0]); err != nil {
			return err
		}
	}
	return nil
}

// hasReuse reports whether some input of b is read again across a
// spatial iteration variable (its indices do not mention it), which is
// what tiling exploits; a row reduction reads each input element once.
func hasReuse(b *ir.Block) bool {
	for _, r := range b.Reads {
		if len(b.Writes) == 1 && r.Buffer == b.Writes[0].Buffer {
			continue
		}
		for _, iv := range b.IterVars {
			if iv.Kind != ir.IterSpatial {
				continue
			}
			used := false
			for _, rg := range r.Region {
				used = used || usesVar(rg.Min, iv.Var)
			}
			if !used {
				return true
			}
		}
	}
	return false
}

// iterIndex returns the index of the iteration variable loop l binds in
// br (loopKinds checked that there is one).
func iterIndex(br *ir.BlockRealize, l schedule.LoopRV) int {
	for i, v := range br.IterValues {
		if vv, ok := v.(*ir.Var); ok && vv == l.Var() {
			return i
		}
	}
	return -1
}

// usesVar reports whether e mentions v.
func usesVar(e ir.Expr, v *ir.Var) bool {
	found := false
	ir.Visit(e, func(n ir.Node) bool {
		if x, ok := n.(*ir.Var); ok && x == v {
			found = true
		}
		return !found
	})
	return found
}
