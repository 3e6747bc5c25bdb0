package timer

import (
	"context"
	"math"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/rpcserver/proto"
)

// binomialCoverage is the exact coverage of [x(k), x(n+1−k)] for the
// median of n samples: 1 − 2·P(B ≤ k−1), B ~ Binomial(n, ½).
func binomialCoverage(n, k int) float64 {
	tail := 0.0
	for j := 0; j < k; j++ {
		c := 1.0
		for i := 0; i < j; i++ {
			c = c * float64(n-i) / float64(i+1)
		}
		tail += c * math.Pow(0.5, float64(n))
	}
	return 1 - 2*tail
}

func TestCIRank(t *testing.T) {
	// Known ranks of the 95% interval for the median (Conover's table).
	for n, want := range map[int]int{6: 1, 7: 1, 8: 1, 9: 2, 10: 2, 11: 2, 12: 3, 20: 6, 30: 10, 100: 40} {
		check.Equal(t, ciRank(n), want, "n =", n)
	}
	for n := MinSamples; n <= 200; n++ {
		k := ciRank(n)
		check.True(t, binomialCoverage(n, k) >= 0.95, "n =", n, "k =", k, "covers at least 95%")
		check.True(t, binomialCoverage(n, k+1) < 0.95, "n =", n, "k =", k, "is the narrowest such interval")
	}
	// Past the exact range, the normal approximation.
	check.Equal(t, ciRank(10000), 4902)
}

func TestAssess(t *testing.T) {
	quiet := proto.MachineState{CPUs: 8, LoadAvg: 0.3}
	loaded := proto.MachineState{CPUs: 2, LoadAvg: 3.24, OtherSessions: 2, Emulated: "qemu-aarch64",
		FreqMinMHz: 800, FreqMaxMHz: 3400, Governors: []string{"powersave"}, TempsC: map[string]float64{"x86_pkg_temp": 91, "acpitz": 40}}
	tests := []struct {
		name    string
		results []float64
		m       proto.MachineState
		within  float64
		verdict string
		reason  string
	}{
		{"too few", []float64{1, 1, 1}, quiet, 0, proto.VerdictNoisy, "too few samples (n=3) for a 95% interval"},
		{"tight", []float64{1.00, 1.01, 0.99, 1.00, 1.005, 0.995}, quiet, 0, proto.VerdictStable, ""},
		// Six samples: the interval is [min, max], 1.1 is 10% off.
		{"wide", []float64{1.00, 1.01, 0.99, 1.00, 1.1, 0.995}, quiet, 0, proto.VerdictNoisy, "median's 95% CI ±10% > ±2%"},
		{"wide but allowed", []float64{1.00, 1.01, 0.99, 1.00, 1.1, 0.995}, quiet, 0.15, proto.VerdictStable, ""},
		{"with context", []float64{1.00, 1.01, 0.99, 1.00, 1.1, 0.995}, loaded, 0, proto.VerdictNoisy,
			"median's 95% CI ±10% > ±2%; load average 3.2 on 2 CPUs; 2 other sessions on the device; CPU frequency 0.80–3.40 GHz (governor powersave); x86_pkg_temp at 91°C; emulated (qemu-aarch64)"},
		{"zero", []float64{0, 0, 0, 0, 0, 0}, quiet, 0, proto.VerdictNoisy, "the median is 0: the clock did not resolve the calls"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rep := Assess(tc.results, tc.m, tc.within)
			check.Equal(t, rep.Verdict, tc.verdict)
			check.Equal(t, rep.Reason, tc.reason)
			check.Equal(t, rep.N, len(tc.results))
			check.True(t, rep.Min <= rep.Median && rep.Median <= rep.Max, rep)
			if rep.N >= MinSamples {
				check.True(t, rep.Min <= rep.CILow && rep.CILow <= rep.Median && rep.Median <= rep.CIHigh && rep.CIHigh <= rep.Max, rep)
			}
			check.Equal(t, rep.Machine.CPUs, tc.m.CPUs)
		})
	}
	rep := Assess([]float64{1, 3}, quiet, 0)
	check.True(t, math.Abs(rep.CV-0.5) < 1e-12, "cv = std / mean", rep.CV)
	check.Equal(t, rep.StableWithin, DefaultStableWithin)
}

func TestPercent(t *testing.T) {
	for f, want := range map[float64]string{0.02: "2%", 0.041: "4.1%", 0.0049: "0.5%", 0: "0%"} {
		check.Equal(t, Percent(f), want)
	}
}

func TestPool(t *testing.T) {
	a := proto.TimeResult{Results: []float64{1, 1.01, 0.99}, Number: 10, Device: "cpu:0",
		Report: &proto.TimeReport{Machine: proto.MachineState{CPUs: 2, LoadAvg: 0.5, FreqMinMHz: 2000, FreqMaxMHz: 2100, Governors: []string{"performance"}}}}
	b := proto.TimeResult{Results: []float64{1.0, 1.005, 0.995}, Number: 12, Device: "cpu:0",
		Report: &proto.TimeReport{Machine: proto.MachineState{CPUs: 2, LoadAvg: 1.5, OtherSessions: 1, FreqMinMHz: 1800, FreqMaxMHz: 2000, Governors: []string{"schedutil"}}}}
	// Each alone is too short for an interval; together they are six.
	check.Equal(t, Assess(a.Results, a.Report.Machine, 0).Verdict, proto.VerdictNoisy)
	p := Pool(0, a, b)
	check.Equal(t, len(p.Results), 6)
	check.Equal(t, p.Number, 12)
	check.Equal(t, p.Report.N, 6)
	check.Equal(t, p.Report.Verdict, proto.VerdictStable, p.Report.Reason)
	m := p.Report.Machine
	check.Equal(t, m.LoadAvg, 1.5)
	check.Equal(t, m.OtherSessions, 1)
	check.Equal(t, m.FreqMinMHz, 1800.0)
	check.Equal(t, m.FreqMaxMHz, 2100.0)
	check.Equal(t, strings.Join(m.Governors, ","), "performance,schedutil")
	check.True(t, math.Abs(p.Median-1.0) < 1e-12 && p.Min == 0.99 && p.Max == 1.01, p)
}

func testFS() fstest.MapFS {
	return fstest.MapFS{
		"proc/loadavg": {Data: []byte("3.24 2.10 1.50 3/812 12345\n")},
		"proc/stat":    {Data: []byte("cpu  1 2 3\ncpu0 1 2 3\ncpu1 1 2 3\nintr 5\n")},
		"proc/cpuinfo": {Data: []byte("processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\n")},
		"sys/devices/system/cpu/cpu0/cpufreq/scaling_cur_freq": {Data: []byte("2400000\n")},
		"sys/devices/system/cpu/cpu0/cpufreq/scaling_governor": {Data: []byte("powersave\n")},
		"sys/devices/system/cpu/cpu1/cpufreq/scaling_cur_freq": {Data: []byte("3100000\n")},
		"sys/devices/system/cpu/cpu1/cpufreq/scaling_governor": {Data: []byte("powersave\n")},
		"sys/class/thermal/thermal_zone0/temp":                 {Data: []byte("45000\n")},
		"sys/class/thermal/thermal_zone0/type":                 {Data: []byte("x86_pkg_temp\n")},
		"sys/class/thermal/thermal_zone1/temp":                 {Data: []byte("38500\n")},
	}
}

func TestProbe(t *testing.T) {
	p := &Probe{FS: testFS(), OtherSessions: func() int { return 2 }}
	m := p.Read()
	check.Equal(t, m.CPUs, 2)
	check.Equal(t, m.LoadAvg, 3.24)
	check.Equal(t, m.FreqMinMHz, 2400.0)
	check.Equal(t, m.FreqMaxMHz, 3100.0)
	check.Equal(t, strings.Join(m.Governors, ","), "powersave")
	check.Equal(t, m.TempsC["x86_pkg_temp"], 45.0)
	check.Equal(t, m.TempsC["thermal_zone1"], 38.5)
	check.Equal(t, m.OtherSessions, 2)
	check.Equal(t, len(m.Unread), 0, m.Unread)

	// A board that exposes nothing: the state says what it could not read.
	m = (&Probe{FS: fstest.MapFS{}, Emulated: "qemu-riscv64"}).Read()
	check.Equal(t, strings.Join(m.Unread, ","), "load average,cpufreq,thermal zones")
	check.Equal(t, m.Emulated, "qemu-riscv64")
	check.True(t, m.CPUs > 0, "the CPUs Go sees when /proc/stat is not readable")
}

func TestForeignCPU(t *testing.T) {
	fs := testFS()
	check.Equal(t, foreignCPU(fs, "amd64"), "")
	check.Equal(t, foreignCPU(fs, "arm64"), "qemu-user (arm64 on amd64)")
	fs["proc/cpuinfo"] = &fstest.MapFile{Data: []byte("processor\t: 0\nBogoMIPS\t: 50.00\nFeatures\t: fp asimd\nCPU implementer\t: 0x41\n")}
	check.Equal(t, foreignCPU(fs, "arm64"), "")
	check.Equal(t, foreignCPU(fs, "riscv64"), "qemu-user (riscv64 on arm64)")
	check.Equal(t, foreignCPU(fs, "mips64"), "", "an architecture it does not know")
}

func TestEvaluateReport(t *testing.T) {
	var now time.Duration
	reads := 0
	fs := testFS()
	e := &Evaluator{
		Call:  func() error { now += time.Millisecond; return nil },
		Timer: &clockTimer{now: &now},
		Probe: &Probe{FS: fs, OtherSessions: func() int { reads++; return reads - 1 }},
	}
	r, err := e.Evaluate(context.Background(), Options{Number: 1, Repeat: 8, MinRepeatMS: 0})
	check.NoError(t, err)
	check.Equal(t, r.Report.N, 8)
	check.Equal(t, r.Report.Verdict, proto.VerdictStable, r.Report.Reason)
	check.Equal(t, reads, 2, "the machine is read before and after")
	check.Equal(t, r.Report.Machine.OtherSessions, 1, "the worse of the two readings")
	w := r.Wire("cpu:0")
	check.Equal(t, w.Report.N, 8)
	check.Equal(t, w.Device, "cpu:0")

	_, err = e.Evaluate(context.Background(), Options{StableWithin: 2})
	check.ErrorIs(t, err, ErrOptions)
}
