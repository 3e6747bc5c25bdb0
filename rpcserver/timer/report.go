package timer

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"

	"github.com/kiln-ml/kiln/rpcserver/proto"
)

// DefaultStableWithin is the threshold of the verdict when none is given:
// a timing is stable when its median's 95% confidence interval is within
// ±2% of the median.
const DefaultStableWithin = 0.02

// MinSamples is the fewest results with which a distribution-free 95%
// interval for the median exists: with n results, [min, max] covers the
// median with probability 1 − 2·2⁻ⁿ, which reaches 95% at n = 6.
const MinSamples = 6

// hotC is the temperature from which a thermal zone is named in a noisy
// verdict's reason: around it, CPUs start to throttle.
const hotC = 85

// Assess computes the validity report of results measured while the
// machine was in state m: the spread, the median's confidence interval,
// and the verdict for threshold within (DefaultStableWithin when ≤ 0).
func Assess(results []float64, m proto.MachineState, within float64) proto.TimeReport {
	if within <= 0 {
		within = DefaultStableWithin
	}
	s := Summarize(results)
	rep := proto.TimeReport{N: len(results), Min: s.Min, Median: s.Median, Max: s.Max, StableWithin: within, Machine: m}
	if s.Mean > 0 {
		rep.CV = s.Std / s.Mean
	}
	var why string
	switch lo, hi, ok := MedianCI(results); {
	case !ok:
		why = fmt.Sprintf("too few samples (n=%d) for a 95%% interval", len(results))
	case s.Median <= 0:
		rep.CILow, rep.CIHigh = lo, hi
		why = "the median is 0: the clock did not resolve the calls"
	default:
		rep.CILow, rep.CIHigh = lo, hi
		rep.CIHalf = math.Max(s.Median-lo, hi-s.Median) / s.Median
		if rep.CIHalf > within {
			why = fmt.Sprintf("median's 95%% CI ±%s > ±%s", Percent(rep.CIHalf), Percent(within))
		}
	}
	if why == "" {
		rep.Verdict = proto.VerdictStable
		return rep
	}
	rep.Verdict = proto.VerdictNoisy
	rep.Reason = strings.Join(append([]string{why}, Context(m)...), "; ")
	return rep
}

// Context lists what in m may have disturbed a timing: a load average
// above half the CPUs, other sessions, a CPU frequency that moved under a
// governor other than "performance", a hot thermal zone, an emulator.
func Context(m proto.MachineState) []string {
	var out []string
	if m.CPUs > 0 && m.LoadAvg > 1 && m.LoadAvg > float64(m.CPUs)/2 {
		out = append(out, fmt.Sprintf("load average %.1f on %d CPUs", m.LoadAvg, m.CPUs))
	}
	switch m.OtherSessions {
	case 0:
	case 1:
		out = append(out, "1 other session on the device")
	default:
		out = append(out, fmt.Sprintf("%d other sessions on the device", m.OtherSessions))
	}
	if m.FreqMinMHz > 0 && m.FreqMaxMHz > 1.1*m.FreqMinMHz && slices.ContainsFunc(m.Governors, func(g string) bool { return g != "performance" }) {
		out = append(out, fmt.Sprintf("CPU frequency %.2f–%.2f GHz (governor %s)", m.FreqMinMHz/1000, m.FreqMaxMHz/1000, strings.Join(m.Governors, ", ")))
	}
	for _, zone := range slices.Sorted(maps.Keys(m.TempsC)) {
		if c := m.TempsC[zone]; c >= hotC {
			out = append(out, fmt.Sprintf("%s at %.0f°C", zone, c))
		}
	}
	if m.Emulated != "" {
		out = append(out, "emulated ("+m.Emulated+")")
	}
	return out
}

// Percent prints a fraction as a percentage with at most one decimal
// ("4.1%", "2%").
func Percent(f float64) string {
	s := fmt.Sprintf("%.1f", f*100)
	return strings.TrimSuffix(s, ".0") + "%"
}

// MedianCI returns a distribution-free 95% confidence interval for the
// median of results: the order statistics x(k) and x(n+1−k), with k the
// largest rank such that P(B < k) ≤ 2.5% for B ~ Binomial(n, ½) (exact up
// to 1000 results, the normal approximation n/2 − 1.96·√n/2 beyond). ok
// is false with fewer than MinSamples results.
func MedianCI(results []float64) (lo, hi float64, ok bool) {
	n := len(results)
	if n < MinSamples {
		return 0, 0, false
	}
	sorted := slices.Clone(results)
	slices.Sort(sorted)
	k := ciRank(n)
	return sorted[k-1], sorted[n-k], true
}

// ciRank is MedianCI's lower rank k (1-based) for n ≥ MinSamples.
func ciRank(n int) int {
	if n > 1000 {
		return max(1, int(math.Floor(float64(n)/2-1.96*math.Sqrt(float64(n))/2)))
	}
	// P(B ≤ j) summed in log space: the terms are C(n, j)·2⁻ⁿ.
	lgN, _ := math.Lgamma(float64(n + 1))
	cdf := 0.0
	k := 0
	for j := 0; j < n; j++ {
		lgJ, _ := math.Lgamma(float64(j + 1))
		lgR, _ := math.Lgamma(float64(n - j + 1))
		cdf += math.Exp(lgN - lgJ - lgR - float64(n)*math.Ln2)
		if cdf > 0.025 {
			break
		}
		k = j + 1 // P(B < j+1) ≤ 2.5%
	}
	return max(1, k)
}

// Pool merges timings of one function into one: their results together,
// the statistics and the report recomputed over them (threshold within),
// the machine states merged as MergeState does. The other fields come
// from the last timing.
func Pool(within float64, rs ...proto.TimeResult) proto.TimeResult {
	if len(rs) == 0 {
		return proto.TimeResult{}
	}
	var all []float64
	var states []proto.MachineState
	for _, r := range rs {
		all = append(all, r.Results...)
		if r.Report != nil {
			states = append(states, r.Report.Machine)
		}
	}
	last := rs[len(rs)-1]
	s := Summarize(all)
	out := last
	out.Results, out.Mean, out.Median, out.Min, out.Max, out.Std = s.Results, s.Mean, s.Median, s.Min, s.Max, s.Std
	rep := Assess(all, MergeState(states...), within)
	out.Report = &rep
	return out
}

// MergeState merges the states read around several parts of one timing:
// the highest load, temperatures, CPU count and session count, the range
// of frequencies, every governor, and what any reading could not read.
func MergeState(ms ...proto.MachineState) proto.MachineState {
	var out proto.MachineState
	for _, m := range ms {
		out.CPUs = max(out.CPUs, m.CPUs)
		out.LoadAvg = math.Max(out.LoadAvg, m.LoadAvg)
		if m.FreqMinMHz > 0 && (out.FreqMinMHz == 0 || m.FreqMinMHz < out.FreqMinMHz) {
			out.FreqMinMHz = m.FreqMinMHz
		}
		out.FreqMaxMHz = math.Max(out.FreqMaxMHz, m.FreqMaxMHz)
		for _, g := range m.Governors {
			if !slices.Contains(out.Governors, g) {
				out.Governors = append(out.Governors, g)
			}
		}
		for z, c := range m.TempsC {
			if out.TempsC == nil {
				out.TempsC = map[string]float64{}
			}
			if old, ok := out.TempsC[z]; !ok || c > old {
				out.TempsC[z] = c
			}
		}
		out.OtherSessions = max(out.OtherSessions, m.OtherSessions)
		if m.Emulated != "" {
			out.Emulated = m.Emulated
		}
		for _, u := range m.Unread {
			if !slices.Contains(out.Unread, u) {
				out.Unread = append(out.Unread, u)
			}
		}
	}
	slices.Sort(out.Governors)
	return out
}
