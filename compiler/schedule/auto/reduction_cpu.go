package auto

import (
	"fmt"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/schedule"
)

// vectorRowsOn schedules each row reduction of s that vectorRowBlock takes,
// y[rows] = y[rows] + E(rows, k) (or max(y, E)) from a constant init
// whose one reduction variable k is bound directly to the innermost
// serial loop of constant extent K, a multiple of L lanes (L = the
// vector's bytes over y's element size), under a loop of its rows:
//
//	k_0, k_1 = split(k, [K/L, L])
//	y_rf = rfactor(k_1)             partial results y_rf[rows, 0:L]
//	reverse_compute_at(y, rows)     (unless rfactor put it there)
//	decompose_reduction(y_rf, k_0)  y_rf[rows, 0:L] = init, vectorized
//	vectorize(k_1)                  y_rf[rows, 0:L] op= E(rows, k_0·L + 0:L)
//	decompose_reduction(y, k_1')    y[rows] = init; for l: y[rows] op= y_rf[rows, l]
//	set_scope(y_rf, "local")        one row's lanes once compacted
//
// A sum is added in another order than the serial loop's (L partial
// sums), so results differ from it by rounding; a maximum is the same.
// Reductions whose E does not vectorize (a math call on k) still gain
// the L independent chains, which the C compiler overlaps. It returns the
// number of reductions scheduled; an error is a primitive's refusal of
// what the checks let through.
//
// The vector of partial results is a choice (RULE/BLOCK/partials, rule
// the rule that asks): L lanes (the rule's own), 2·L (two registers,
// two chains of additions per lane) where they divide K at least twice,
// or none (the loop stays serial).
func vectorRowsOn(s *schedule.Schedule, opts Options, rule string) (int, error) {
	return VectorRows(s, opts, func(block string) string { return rule + "/" + block + "/partials" })
}

// VectorRows applies vectorRowsOn's primitives to every row reduction of
// s it takes, asking opts.Decide for each one's vector of partial
// results at site(block) among {none, L lanes, 2·L} (the rule's own pick
// is L). The tuner's vector_accumulate rule calls it with a Decider of
// its own; it returns the number of reductions scheduled.
func VectorRows(s *schedule.Schedule, opts Options, site func(block string) string) (int, error) {
	vectorBytes := opts.VectorBytes
	var names []string
	ir.Visit(s.Func().Body, func(n ir.Node) bool {
		if fr, ok := n.(*ir.For); ok {
			if name, ok := vectorRowBlock(fr, vectorBytes); ok {
				names = append(names, name)
			}
		}
		return true
	})
	done := 0
	for _, name := range names {
		ok, err := vectorRowSchedule(s, name, vectorBytes, opts, site(name))
		if err != nil {
			return done, fmt.Errorf("block %q: %w", name, err)
		}
		if ok {
			done++
		}
	}
	return done, nil
}

// vectorRowSchedule applies vectorRowsOn's primitives to block name, or
// reports false when its reduction loop has no loop of rows around it.
func vectorRowSchedule(s *schedule.Schedule, name string, vectorBytes int64, opts Options, site string) (bool, error) {
	b, loops, err := blockLoops(s, name)
	if err != nil || len(loops) < 2 {
		return false, err
	}
	k, rows := loops[len(loops)-1], loops[len(loops)-2]
	br, err := s.BlockRealize(b)
	if err != nil {
		return false, err
	}
	fk, err := s.LoopFor(k)
	if err != nil {
		return false, err
	}
	K, _ := ir.IsConstInt(fk.Extent)
	L := vectorBytes / int64(br.Block.Body.(*ir.BufferStore).Buffer.DType.Size())
	cands := []int64{0, L}
	if K%(2*L) == 0 && K >= 4*L {
		cands = append(cands, 2*L)
	}
	if L, err = opts.choose(s, site, cands, L); err != nil || L == 0 {
		return false, err
	}
	parts, err := s.Split(k, K/L, L)
	if err != nil {
		return false, err
	}
	rf, err := s.RFactor(parts[1], -1)
	if err != nil {
		return false, err
	}
	if under, err := underLoop(s, b, rows); err != nil {
		return false, err
	} else if !under {
		if err := s.ReverseComputeAt(b, rows); err != nil {
			return false, err
		}
	}
	init, err := s.DecomposeReduction(rf, parts[0])
	if err != nil {
		return false, err
	}
	if err := vectorizeLast(s, init); err != nil {
		return false, err
	}
	if err := s.Vectorize(parts[1]); err != nil {
		return false, err
	}
	wl, err := s.GetLoops(b)
	if err != nil {
		return false, err
	}
	if _, err := s.DecomposeReduction(b, wl[len(wl)-1]); err != nil {
		return false, err
	}
	return true, s.SetScope(rf, 0, "local")
}

// underLoop reports whether block b is under loop l.
func underLoop(s *schedule.Schedule, b schedule.BlockRV, l schedule.LoopRV) (bool, error) {
	loops, err := s.GetLoops(b)
	if err != nil {
		return false, err
	}
	fl, err := s.LoopFor(l)
	if err != nil {
		return false, err
	}
	for _, x := range loops {
		if f, err := s.LoopFor(x); err == nil && f == fl {
			return true, nil
		}
	}
	return false, nil
}

// vectorRowBlock returns the name of the block of loop fr when fr is the
// reduction loop of a row reduction vectorRowsOn takes, with vectors of
// vectorBytes.
func vectorRowBlock(fr *ir.For, vectorBytes int64) (string, bool) {
	br, ok := fr.Body.(*ir.BlockRealize)
	if !ok || fr.Kind != ir.ForSerial || br.Block == nil || br.Block.Init == nil || !isTrue(br.Predicate) {
		return "", false
	}
	b := br.Block
	n := len(b.IterVars)
	if n < 2 || len(br.IterValues) != n || len(b.AllocBuffers) > 0 || !isVar(br.IterValues[n-1], fr.Var) {
		return "", false
	}
	for i, iv := range b.IterVars {
		if (iv.Kind == ir.IterReduce) != (i == n-1) {
			return "", false
		}
	}
	st, ok := b.Body.(*ir.BufferStore)
	if !ok {
		return "", false
	}
	if _, ok := reduction(b, st); !ok {
		return "", false
	}
	K, ok := ir.IsConstInt(fr.Extent)
	size := int64(st.Buffer.DType.Size())
	if m, isConst := ir.IsConstInt(fr.Min); !ok || !isConst || m != 0 || size <= 0 || st.Buffer.DType.Lanes != 1 {
		return "", false
	}
	L := vectorBytes / size
	if L < 2 || L&(L-1) != 0 || K%L != 0 || K < 2*L {
		return "", false
	}
	return b.Name, true
}
