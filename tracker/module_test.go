package tracker

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/rpcserver/proto"
	"github.com/kiln-ml/kiln/tracker/store"
)

// moduleFiles lists the module store's blobs under a tracker's DataDir.
func moduleFiles(t *testing.T, dataDir string) []string {
	t.Helper()
	var out []string
	root := filepath.Join(dataDir, "artifacts", "modules")
	filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && filepath.Base(filepath.Dir(p)) != "tmp" {
			out = append(out, p)
		}
		return nil
	})
	return out
}

// TestModulesOutOfTheStore: a queued job's module text is kept neither in
// the tracker's memory nor in tracker.db or its log, but in the module
// store, from which the compiler node that takes the job gets it whole,
// across a restart; once the job is done it is removed.
func TestModulesOutOfTheStore(t *testing.T) {
	cfg := fastConfig(t)
	a := startTracker(t, cfg)
	ctx := testCtx(t)
	tc := dialTracker(t, a.Addr())
	marker := "# kept-out-" + strings.Repeat("m", 200<<10) + "\n"
	j, err := tc.SubmitBuild(ctx, proto.BuildSubmitArgs{Name: "big", Module: marker + module, Target: "cpu"})
	check.NoError(t, err)
	a.mu.Lock()
	held := a.jobs[j.ID].module
	a.mu.Unlock()
	check.Equal(t, held, "", "the queued job holds its module text in memory")
	check.Equal(t, len(moduleFiles(t, cfg.DataDir)), 1)
	a.stop(t)
	for _, f := range []string{"tracker.db", "tracker.db.wal"} {
		b, err := os.ReadFile(filepath.Join(cfg.DataDir, f))
		check.NoError(t, err)
		check.True(t, !bytes.Contains(b, []byte("# kept-out-mmmm")), f, "holds the module text")
	}

	cfg.Listen = a.Addr()
	b := startTracker(t, cfg)
	cpu, _ := compiler(t, b.Addr(), "cpu")
	var got *proto.BuildJob
	eventually(t, "the compiler takes the job", func() bool {
		got, err = cpu.TakeJob(ctx, 100*time.Millisecond)
		return err == nil && got != nil
	})
	check.Equal(t, got.ID, j.ID)
	check.True(t, got.Module == marker+module, "the module taken differs from the one submitted:", len(got.Module), "bytes")
	check.NoError(t, cpu.FailJob(ctx, got.ID, "planned", ""))
	eventually(t, "the finished job's module is removed", func() bool { return len(moduleFiles(t, cfg.DataDir)) == 0 })
}

// TestLegacyModuleLoads: a queued job stored with its module text in the
// modules table (as trackers before the module store kept it) loads, and
// the compiler node that takes it gets its text.
func TestLegacyModuleLoads(t *testing.T) {
	cfg := fastConfig(t)
	st, err := store.OpenBolt(filepath.Join(cfg.DataDir, "tracker.db"), store.Hooks{})
	check.NoError(t, err)
	now := time.Now()
	rec := jobRecord{Job: proto.BuildJob{ID: "j-00000007", Name: "old", Target: "cpu", State: proto.JobQueued, Submitted: now,
		QueueTimeout: time.Hour, RunTimeout: time.Minute}, QueuedAt: now}
	check.NoError(t, st.Wait(st.Apply(store.Put(store.Jobs, rec.Job.ID, rec), store.Put(store.Modules, rec.Job.ID, module),
		store.Put(store.Meta, store.MetaNextJob, uint64(7)))))
	check.NoError(t, st.Close())
	a := startTracker(t, cfg)
	cpu, _ := compiler(t, a.Addr(), "cpu")
	got, err := cpu.TakeJob(testCtx(t), time.Second)
	check.NoError(t, err)
	check.True(t, got != nil, "no job taken")
	check.Equal(t, got.ID, rec.Job.ID)
	check.Equal(t, got.Module, module)
}

// TestReplicaModulesOutOfMemory: a replica keeps a queued job's module in
// etcd, not in its memory, and the compiler node that takes the job gets
// it whole.
func TestReplicaModulesOutOfMemory(t *testing.T) {
	cfg := fastConfig(t)
	etcdStoreConfig(t, &cfg)
	cfg.ElectionTTL = time.Second
	r := startTracker(t, cfg)
	eventually(t, "the replica leads", func() bool { return r.rep.currentTerm() != nil && r.Ready() == nil })
	ctx := testCtx(t)
	tc := dialTracker(t, r.Addr())
	text := "# " + strings.Repeat("r", 100<<10) + "\n" + module
	j, err := tc.SubmitBuild(ctx, proto.BuildSubmitArgs{Name: "replicated", Module: text, Target: "cpu"})
	check.NoError(t, err)
	term := r.rep.currentTerm()
	term.mu.Lock()
	held, stored := term.jobs[j.ID].module, term.jobs[j.ID].moduleStored
	term.mu.Unlock()
	check.True(t, held == "" && stored, "the queued job's module is held in memory")
	cpu, _ := compiler(t, r.Addr(), "cpu")
	var got *proto.BuildJob
	eventually(t, "the compiler takes the job", func() bool {
		got, err = cpu.TakeJob(ctx, 100*time.Millisecond)
		return err == nil && got != nil
	})
	check.Equal(t, got.ID, j.ID)
	check.True(t, got.Module == text, "the module taken differs from the one submitted:", len(got.Module), "bytes")
}
