package tracker

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/kiln-ml/kiln/client"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/rpcserver/proto"
)

// compilerWith registers a compiler node with the given attributes.
func compilerWith(t testing.TB, addr string, attrs proto.NodeAttrs) (*client.Registrar, context.CancelFunc) {
	t.Helper()
	r := client.NewRegistrar(addr, client.TrackerOptions{Logger: quietLogger()}, proto.RegisterArgs{Role: proto.NodeCompiler, Attrs: attrs})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		r.Run(ctx)
	}()
	stop := func() {
		cancel()
		<-done
	}
	t.Cleanup(stop)
	select {
	case <-r.Ready():
	case <-time.After(guard):
		t.Fatal("compiler did not register")
	}
	return r, stop
}

// TestBuildJobsRoutedByTriple: two compiler nodes serving different
// triples each get only the jobs they can build; a job for a triple no
// node serves fails at submit, naming what the nodes serve, and the queue
// is left as it was.
func TestBuildJobsRoutedByTriple(t *testing.T) {
	tr := startTracker(t, fastConfig(t))
	ctx := testCtx(t)
	tc := dialTracker(t, tr.Addr())
	x86, _ := compilerWith(t, tr.Addr(), proto.NodeAttrs{Targets: []string{"cpu"}, Triple: "x86_64-linux-gnu"})
	arm, stopArm := compilerWith(t, tr.Addr(), proto.NodeAttrs{
		Targets: []string{"cpu -mtriple=aarch64-linux-gnu", "cpu -mtriple=riscv64-linux-gnu"}, CrossCompilers: []string{"aarch64-linux-gnu", "riscv64-linux-gnu"},
	})

	armJob, err := tc.SubmitBuild(ctx, proto.BuildSubmitArgs{Name: "a.py", Module: module, Target: "cpu -mtriple=aarch64-linux-gnu -mcpu=cortex-a72"})
	check.NoError(t, err)
	check.Equal(t, armJob.State, proto.JobQueued)
	// The x86 node does not take the arm64 job.
	none, err := x86.TakeJob(ctx, 50*time.Millisecond)
	check.NoError(t, err)
	check.True(t, none == nil, "the x86 node took an aarch64 job")

	// A job nobody builds fails at once; the arm64 job stays queued.
	mips, err := tc.SubmitBuild(ctx, proto.BuildSubmitArgs{Name: "m.py", Module: module, Target: "cpu -mtriple=mips-linux-gnu"})
	check.NoError(t, err)
	check.Equal(t, mips.State, proto.JobFailed)
	want := `no compiler node can build target "cpu -mtriple=mips-linux-gnu"; nodes serve: cpu (x86_64-linux-gnu), cpu -mtriple=aarch64-linux-gnu, cpu -mtriple=riscv64-linux-gnu`
	check.Equal(t, mips.Error, want)
	_, err = tc.WaitBuild(ctx, mips.ID, nil)
	check.True(t, errors.Is(err, client.ErrBuildFailed) && strings.Contains(err.Error(), want), "the client's wait:", err)
	sum, err := tc.Query(ctx, 10)
	check.NoError(t, err)
	states := map[string]proto.JobState{}
	for _, j := range sum.Jobs {
		states[j.ID] = j.State
		if j.ID == mips.ID {
			check.Equal(t, j.Error, want)
		}
	}
	check.Equal(t, states[mips.ID], proto.JobFailed)
	check.Equal(t, states[armJob.ID], proto.JobQueued)

	// An x86 triple (spelled with a vendor) goes to the x86 node, the
	// arm64 job to the arm node.
	hostJob, err := tc.SubmitBuild(ctx, proto.BuildSubmitArgs{Name: "h.py", Module: module, Target: "llvm -mtriple=x86_64-pc-linux-gnu"})
	check.NoError(t, err)
	check.Equal(t, hostJob.State, proto.JobQueued)
	got, err := x86.TakeJob(ctx, time.Second)
	check.NoError(t, err)
	check.True(t, got != nil && got.ID == hostJob.ID, "the x86 node took", got)
	got, err = arm.TakeJob(ctx, time.Second)
	check.NoError(t, err)
	check.True(t, got != nil && got.ID == armJob.ID, "the arm node took", got)
	check.NoError(t, arm.FailJob(ctx, armJob.ID, "aarch64-linux-gnu-gcc: fatal error: no input files", ""))

	// When the only node for a triple leaves, a job queued for it stays
	// queued and says why it waits.
	rv, err := tc.SubmitBuild(ctx, proto.BuildSubmitArgs{Name: "r.py", Module: module, Target: "cpu -mtriple=riscv64-linux-gnu"})
	check.NoError(t, err)
	check.Equal(t, rv.State, proto.JobQueued)
	stopArm()
	deadline := time.Now().Add(guard)
	for {
		j, err := tc.BuildStatus(ctx, rv.ID)
		check.NoError(t, err)
		if strings.Contains(j.Message, "no compiler node can build target") {
			check.Equal(t, j.State, proto.JobQueued)
			check.Equal(t, j.Message, `waiting: no compiler node can build target "cpu -mtriple=riscv64-linux-gnu"; nodes serve: cpu (x86_64-linux-gnu)`)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the riscv64 job after its node left: %+v", j)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// And a new riscv64 job fails at submit.
	rv2, err := tc.SubmitBuild(ctx, proto.BuildSubmitArgs{Name: "r2.py", Module: module, Target: "cpu -mtriple=riscv64-linux-gnu"})
	check.NoError(t, err)
	check.Equal(t, rv2.State, proto.JobFailed)
}

// TestBuildJobQueuesWithoutCompilers: with no compiler node registered a
// job waits for one (nodes may not have registered yet).
func TestBuildJobQueuesWithoutCompilers(t *testing.T) {
	tr := startTracker(t, fastConfig(t))
	ctx := testCtx(t)
	tc := dialTracker(t, tr.Addr())
	j, err := tc.SubmitBuild(ctx, proto.BuildSubmitArgs{Name: "a.py", Module: module, Target: "cpu -mtriple=aarch64-linux-gnu"})
	check.NoError(t, err)
	check.Equal(t, j.State, proto.JobQueued)
	arm, _ := compilerWith(t, tr.Addr(), proto.NodeAttrs{Targets: []string{"cpu"}, Triple: "aarch64-unknown-linux-gnu"})
	got, err := arm.TakeJob(ctx, time.Second)
	check.NoError(t, err)
	check.True(t, got != nil && got.ID == j.ID, "the arm64 node took", got)
}

func TestCanBuild(t *testing.T) {
	a := proto.NodeAttrs{Targets: []string{"cpu", "cuda", "c -mtriple=riscv64-linux-gnu"}, Triple: "x86_64-linux-gnu"}
	for target, want := range map[string]bool{
		"cpu":                                      true,
		"llvm -mcpu=znver4":                        true,
		"cpu -mtriple=x86_64-linux-gnu":            true,
		"cpu -mtriple=x86_64-unknown-linux-gnu":    true,
		"cpu -mtriple=amd64-linux-gnu":             true,
		"cpu -mtriple=riscv64-linux-gnu -mattr=+v": true,
		"cpu -mtriple=aarch64-linux-gnu":           false,
		"cpu -mtriple=x86_64-linux-musl":           false,
		"nvptx -arch=sm_80":                        true,
		"rocm":                                     false,
		"":                                         false,
	} {
		check.Equal(t, a.CanBuild(target), want, target)
	}
	// A node that does not state its triple builds no -mtriple target
	// but those it names.
	b := proto.NodeAttrs{Targets: []string{"cpu"}}
	check.Equal(t, b.CanBuild("cpu -mtriple=x86_64-linux-gnu"), false)
	check.Equal(t, b.CanBuild("cpu"), true)
}
