package tracker

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kiln-ml/kiln/client"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/rpcserver/proto"
)

// replicaSet is three trackers, each with an embedded etcd member: one
// three-member etcd cluster, one fleet.
type replicaSet struct {
	reps []*running
}

func startReplicas(t testing.TB, setup ...func(*Config)) *replicaSet {
	t.Helper()
	names := []string{"a", "b", "c"}
	var peers []string
	for _, n := range names {
		peers = append(peers, fmt.Sprintf("%s=https://127.0.0.1:%s", n, freePort(t)))
	}
	pki := peerPKI(t)
	cfgs := make([]Config, len(names))
	for i, n := range names {
		cfgs[i] = fastConfig(t)
		cfgs[i].ElectionTTL = time.Second
		cfgs[i].Cluster = &ClusterConfig{
			Name: n, Peers: strings.Join(peers, ","), ClientURL: "https://127.0.0.1:" + freePort(t), noFsync: true,
		}
		pki(cfgs[i].Cluster)
		for _, f := range setup {
			f(&cfgs[i])
		}
	}
	// The members wait for each other: start them together.
	srvs := make([]*Server, len(names))
	errs := make([]error, len(names))
	var wg sync.WaitGroup
	for i := range names {
		wg.Go(func() { srvs[i], errs[i] = New(cfgs[i]) })
	}
	wg.Wait()
	rs := &replicaSet{}
	for i := range names {
		check.NoError(t, errs[i], "replica", names[i])
		ctx, cancel := context.WithCancel(context.Background())
		r := &running{Server: srvs[i], cancel: cancel, errc: make(chan error, 1)}
		go func() { r.errc <- srvs[i].Run(ctx) }()
		rs.reps = append(rs.reps, r)
	}
	// Stop them together: one stopped alone takes its etcd member away
	// from the others.
	t.Cleanup(func() {
		for _, r := range rs.reps {
			r.cancel()
		}
		for _, r := range rs.reps {
			r.stop(t)
		}
	})
	return rs
}

// leader waits for a replica to lead and serve, other than not, and
// returns its index.
func (rs *replicaSet) leader(t testing.TB, not int) int {
	t.Helper()
	at := -1
	eventually(t, "a replica leads", func() bool {
		for i, r := range rs.reps {
			if i == not {
				continue
			}
			r.rep.mu.Lock()
			leads := r.rep.term != nil
			r.rep.mu.Unlock()
			if leads {
				at = i
				return true
			}
		}
		return false
	})
	return at
}

// crash ends replica i as a killed process would end: its etcd client and
// member go first, so it neither resigns nor writes again.
func (rs *replicaSet) crash(t *testing.T, i int) {
	r := rs.reps[i]
	r.rep.cli.Close()
	r.rep.stopMember()
	r.cancel()
	select {
	case <-r.errc:
		close(r.errc)
	case <-time.After(2 * guard):
		t.Fatal("crashed replica did not stop")
	}
}

// TestReplicas: three replicas on their own three-member etcd cluster. A
// follower takes every kind of call and forwards it to the leader; when
// the leader dies another replica takes over from etcd's state: the
// queued job is there, the granted lease still holds its device (it is
// not granted twice), nodes re-register through the followers.
func TestReplicas(t *testing.T) {
	rs := startReplicas(t, func(c *Config) { c.TVMListen = "127.0.0.1:0" })
	ctx := testCtx(t)
	lead := rs.leader(t, -1)
	follower := rs.reps[(lead+1)%3]
	spare := rs.reps[(lead+2)%3]
	eventually(t, "the followers know the leader", func() bool { return follower.Ready() == nil && spare.Ready() == nil })

	dev, _ := device(t, follower.Addr(), "k", proto.NodeAttrs{})
	tc, err := client.DialTracker(ctx, follower.Addr()+","+spare.Addr(), client.TrackerOptions{Logger: quietLogger()})
	check.NoError(t, err)
	defer tc.Close()
	job, err := tc.SubmitBuild(ctx, proto.BuildSubmitArgs{Name: "one", Module: module, Target: "cpu"})
	check.NoError(t, err)
	lease, err := tc.RequestLease(ctx, client.LeaseRequest{Key: "k", NoRenew: true, TTL: time.Minute})
	check.NoError(t, err)
	check.Equal(t, lease.NodeID, dev.NodeID())

	// The leader exports the tracker's gauges; a follower says it follows.
	var lm, fm strings.Builder
	check.NoError(t, rs.reps[lead].WriteMetrics(&lm))
	check.NoError(t, follower.WriteMetrics(&fm))
	check.True(t, strings.Contains(lm.String(), "kiln_tracker_leader 1") && strings.Contains(lm.String(), "kiln_tracker_build_queue_depth 1"), lm.String())
	check.True(t, strings.Contains(fm.String(), "kiln_tracker_leader 0") && !strings.Contains(fm.String(), "kiln_tracker_build_queue_depth"), fm.String())

	// TVM protocol peers of either follower meet at the leader.
	srv := dialTVM(t, follower.TVMAddr())
	check.Equal(t, srv.call([]any{tvmUpdateInfo, map[string]any{"key": "server:rasp", "addr": []any{nil, 9091}}}), any(float64(tvmSuccess)))
	check.Equal(t, srv.call([]any{tvmPut, "rasp", []any{9091, "rasp:0.123"}, nil}), any(float64(tvmSuccess)))
	tvm := dialTVM(t, spare.TVMAddr())
	sum := tvm.call([]any{tvmSummary}).([]any)[1].(map[string]any)
	check.Equal(t, sum["queue_info"].(map[string]any)["rasp"], any(map[string]any{"free": float64(1), "pending": float64(0)}))

	rs.crash(t, lead)
	next := rs.leader(t, lead)
	check.True(t, next != lead)
	nl := rs.reps[next].Server

	// The job and the lease are the new leader's, from etcd.
	got, err := tc.BuildStatus(ctx, job.ID)
	check.NoError(t, err)
	check.Equal(t, got.State, proto.JobQueued)
	eventually(t, "device re-registers with the new leader", func() bool {
		s := nl.rep.currentTerm()
		return s != nil && nodeState(s, dev.NodeID()) == proto.StateBusy
	})
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err = tc.RequestLease(short, client.LeaseRequest{Key: "k"})
	cancel()
	check.ErrorIs(t, err, proto.ErrDeadline)
	check.NoError(t, lease.Release(ctx))
	again, err := tc.RequestLease(ctx, client.LeaseRequest{Key: "k", NoRenew: true})
	check.NoError(t, err)
	check.True(t, again.ID != lease.ID, again.ID)
	check.NoError(t, again.Release(ctx))
}

// TestEtcdLost: while its etcd is down the tracker says it is not ready
// and refuses new work with a retryable error; when etcd is back it
// serves again, with the job queued before the outage.
func TestEtcdLost(t *testing.T) {
	member := ClusterConfig{
		Name: "solo", Peers: "solo=https://127.0.0.1:" + freePort(t),
		ClientURL: "https://127.0.0.1:" + freePort(t), Dir: t.TempDir(), noFsync: true,
	}
	e, err := startMember(member, "", "", guard, nil)
	check.NoError(t, err)
	defer func() { e.Close() }()
	cfg := fastConfig(t)
	cfg.ElectionTTL = time.Second
	cfg.Store = "etcd://" + strings.TrimPrefix(member.ClientURL, "https://")
	cfg.EtcdTLS = e.clientTLS
	r := startTracker(t, cfg)
	ctx := testCtx(t)
	eventually(t, "the replica leads", func() bool { return r.rep.currentTerm() != nil && r.Ready() == nil })
	tc, err := client.DialTracker(ctx, r.Addr(), client.TrackerOptions{Logger: quietLogger(), FailoverTimeout: 300 * time.Millisecond})
	check.NoError(t, err)
	defer tc.Close()
	job, err := tc.SubmitBuild(ctx, proto.BuildSubmitArgs{Name: "kept", Module: module, Target: "cpu"})
	check.NoError(t, err)

	e.Close()
	eventually(t, "not ready without etcd", func() bool { return r.Ready() != nil })
	check.ErrorIs(t, r.Ready(), proto.ErrUnavailable)
	_, err = tc.SubmitBuild(ctx, proto.BuildSubmitArgs{Name: "refused", Module: module, Target: "cpu"})
	check.ErrorIs(t, err, proto.ErrUnavailable)
	_, err = tc.RequestLease(ctx, client.LeaseRequest{Key: "k"})
	check.ErrorIs(t, err, proto.ErrUnavailable)

	e, err = startMember(member, "", "", guard, nil)
	check.NoError(t, err)
	eventually(t, "ready again", func() bool { return r.Ready() == nil })
	got, err := tc.BuildStatus(ctx, job.ID)
	check.NoError(t, err)
	check.Equal(t, got.State, proto.JobQueued)
	_, err = tc.SubmitBuild(ctx, proto.BuildSubmitArgs{Name: "after", Module: module, Target: "cpu"})
	check.NoError(t, err)
}
