package tracker

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/kiln-ml/kiln/client"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/rpcserver/proto"
)

func sampleResult(fn, label string, xs ...float64) proto.Result {
	return proto.Result{
		Label: label, Source: proto.ResultSourceBench, Function: fn, Target: "cpu",
		Artifact: "ab12", DeviceKey: "cpu", NodeID: "device-1", KilnVersion: "v1.2.3",
		DeviceAttrs: proto.NodeAttrs{DeviceTypes: []string{"cpu"}, CPUFeatures: []string{"avx2"}, CPUCores: 8},
		Inputs:      []string{"A:float32[256]"},
		Time: proto.TimeResult{Results: xs, Median: xs[len(xs)/2], Number: 10,
			Report: &proto.TimeReport{Verdict: proto.VerdictNoisy, Reason: "too few samples", N: len(xs), Machine: proto.MachineState{CPUs: 8}}},
		Kernels: []proto.KernelTime{{Name: "fused_add", Results: xs}},
	}
}

// resultsFleet starts a tracker with a users file holding alice and bob,
// and the fleet token "fleet"; it returns it and a dialer.
func resultsFleet(t *testing.T, cfg Config) (*running, func(user string) *client.Tracker) {
	cfg.Token = "fleet"
	toks := map[string]string{"admin": "fleet"}
	for _, u := range []string{"alice", "bob"} {
		tok, err := CreateUserToken(cfg.UsersFile, u, "client")
		check.NoError(t, err)
		toks[u] = tok
	}
	s := startTracker(t, cfg)
	return s, func(user string) *client.Tracker {
		tr, err := client.DialTracker(testCtx(t), s.Addr(), client.TrackerOptions{Token: toks[user], Logger: quietLogger()})
		check.NoError(t, err)
		t.Cleanup(func() { tr.Close() })
		return tr
	}
}

func resultIDs(l proto.ResultList) []string {
	var ids []string
	for _, r := range l.Results {
		ids = append(ids, r.ID)
	}
	return ids
}

// TestResultsOwners: a result is its recorder's; another user sees it
// only when it is shared, the fleet token sees every one; filters apply.
func TestResultsOwners(t *testing.T) {
	cfg := fastConfig(t)
	cfg.UsersFile = filepath.Join(t.TempDir(), "users")
	_, dial := resultsFleet(t, cfg)
	ctx := testCtx(t)
	alice, bob, admin := dial("alice"), dial("bob"), dial("admin")

	priv, err := alice.RecordResult(ctx, sampleResult("vadd", "pr-1", 1, 2, 3))
	check.NoError(t, err)
	check.Equal(t, priv.Owner, "alice")
	check.True(t, priv.ID != "" && !priv.Recorded.IsZero(), priv)
	shared := sampleResult("matmul", "pr-1", 4)
	shared.Shared = true
	shared.Owner = "mallory" // the tracker says who owns it
	sh, err := alice.RecordResult(ctx, shared)
	check.NoError(t, err)
	check.Equal(t, sh.Owner, "alice")
	bobs, err := bob.RecordResult(ctx, sampleResult("vadd", "main", 5))
	check.NoError(t, err)

	l, err := bob.ListResults(ctx, proto.ResultListArgs{})
	check.NoError(t, err)
	check.Equal(t, resultIDs(l), []string{bobs.ID, sh.ID})
	_, err = bob.GetResult(ctx, priv.ID)
	check.ErrorIs(t, err, proto.ErrNotFound)
	got, err := bob.GetResult(ctx, sh.ID)
	check.NoError(t, err)
	check.Equal(t, got.Function, "matmul")

	l, err = admin.ListResults(ctx, proto.ResultListArgs{})
	check.NoError(t, err)
	check.Equal(t, l.Total, 3)
	_, err = admin.GetResult(ctx, priv.ID)
	check.NoError(t, err)

	for name, tc := range map[string]struct {
		a    proto.ResultListArgs
		want []string
	}{
		"function": {proto.ResultListArgs{Function: "vadd"}, []string{bobs.ID, priv.ID}},
		"label":    {proto.ResultListArgs{Label: "pr-1"}, []string{sh.ID, priv.ID}},
		"attr":     {proto.ResultListArgs{Attrs: map[string]string{"cpu.avx2": "true"}, Owner: "bob"}, []string{bobs.ID}},
		"no attr":  {proto.ResultListArgs{Attrs: map[string]string{"cpu.avx512": "true"}}, nil},
		"key":      {proto.ResultListArgs{DeviceKey: "gpu"}, nil},
		"since":    {proto.ResultListArgs{Since: time.Now().Add(time.Hour)}, nil},
		"limit":    {proto.ResultListArgs{Limit: 1}, []string{bobs.ID}},
	} {
		t.Run(name, func(t *testing.T) {
			l, err := admin.ListResults(ctx, tc.a)
			check.NoError(t, err)
			check.Equal(t, resultIDs(l), tc.want)
		})
	}

	_, err = alice.RecordResult(ctx, proto.Result{Function: "vadd"})
	check.ErrorIs(t, err, proto.ErrBadRequest)
}

// TestResultsCap: past MaxResultsPerUser a user's oldest results are
// evicted, durably, and other users' are not.
func TestResultsCap(t *testing.T) {
	cfg := fastConfig(t)
	cfg.UsersFile = filepath.Join(t.TempDir(), "users")
	cfg.MaxResultsPerUser = 3
	s, dial := resultsFleet(t, cfg)
	ctx := testCtx(t)
	alice, bob := dial("alice"), dial("bob")
	bobs, err := bob.RecordResult(ctx, sampleResult("vadd", "", 1))
	check.NoError(t, err)
	var ids []string
	for i := range 5 {
		r, err := alice.RecordResult(ctx, sampleResult("vadd", "", float64(i+1)))
		check.NoError(t, err)
		ids = append([]string{r.ID}, ids...)
	}
	l, err := alice.ListResults(ctx, proto.ResultListArgs{})
	check.NoError(t, err)
	check.Equal(t, resultIDs(l), ids[:3])
	_, err = alice.GetResult(ctx, ids[4])
	check.ErrorIs(t, err, proto.ErrNotFound)

	// After a restart the evicted ones stay gone.
	alice.Close()
	bob.Close()
	s.stop(t)
	cfg.MaxResultsPerUser = 2 // lowered: applied at load
	_, dial = resultsFleet(t, cfg)
	l, err = dial("admin").ListResults(ctx, proto.ResultListArgs{})
	check.NoError(t, err)
	check.Equal(t, resultIDs(l), append(ids[:2:2], bobs.ID))
}

// TestResultsLimits: a result over a limit is refused, naming the limit.
func TestResultsLimits(t *testing.T) {
	cfg := fastConfig(t)
	cfg.UsersFile = filepath.Join(t.TempDir(), "users")
	_, dial := resultsFleet(t, cfg)
	ctx := testCtx(t)
	alice := dial("alice")
	r := sampleResult("vadd", "", 1, 2, 3)
	r.Kernels[0].Ops = make([]string, proto.MaxKernelOps+1)
	_, err := alice.RecordResult(ctx, r)
	check.ErrorIs(t, err, proto.ErrTooLarge)
	check.Error(t, err, "model operators, at most")
	r.Kernels[0].Ops = r.Kernels[0].Ops[:proto.MaxKernelOps]
	_, err = alice.RecordResult(ctx, r)
	check.NoError(t, err)
	_, err = alice.RecordResult(ctx, proto.Result{Function: "vadd"})
	check.ErrorIs(t, err, proto.ErrBadRequest)
}
