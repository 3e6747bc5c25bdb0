package tracker

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kiln-ml/kiln/client"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/rpcserver/proto"
)

// moduleGen yields size bytes of a module (comment lines, then a module
// that parses) without holding them; after gateAt bytes it waits for gate
// to close (nil: no gate), or fails once ctx ends.
type moduleGen struct {
	ctx       context.Context
	size, off int64
	gateAt    int64
	gate      <-chan struct{}
}

// genBlock is 64 KiB of comment lines, 128 bytes each.
var genBlock = strings.Repeat("# "+strings.Repeat("k", 125)+"\n", 512)

func (g *moduleGen) Read(p []byte) (int, error) {
	if g.off >= g.size {
		return 0, io.EOF
	}
	if g.gate != nil && g.off >= g.gateAt {
		select {
		case <-g.gate:
			g.gate = nil
		case <-g.ctx.Done():
			return 0, g.ctx.Err()
		}
	}
	lim := g.size
	if g.gate != nil {
		lim = g.gateAt
	}
	p = p[:min(int64(len(p)), lim-g.off)]
	tail := g.size - int64(len(module))
	n := 0
	for n < len(p) {
		var k int
		if off := g.off + int64(n); off >= tail {
			k = copy(p[n:], module[off-tail:])
		} else {
			k = copy(p[n:min(int64(len(p)), int64(n)+tail-off)], genBlock[off%int64(len(genBlock)):])
		}
		n += k
	}
	g.off += int64(n)
	return n, nil
}

// genSHA256 is the digest of the size bytes moduleGen yields.
func genSHA256(t *testing.T, size int64) string {
	h := sha256.New()
	_, err := io.Copy(h, &moduleGen{ctx: context.Background(), size: size})
	check.NoError(t, err)
	return hex.EncodeToString(h.Sum(nil))
}

// spooled returns the sizes of the module store's spool files under a
// tracker's DataDir: the modules arriving.
func spooled(t *testing.T, dataDir string) []int64 {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(dataDir, "artifacts", "modules", "tmp"))
	check.NoError(t, err)
	var out []int64
	for _, e := range ents {
		if info, err := e.Info(); err == nil {
			out = append(out, info.Size())
		}
	}
	return out
}

// heapInuse is the heap in use after a collection.
func heapInuse() int64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapInuse)
}

// TestStreamedSubmitsStayOutOfTheHeap performs the attack of a user who
// fills the build queue with large modules, sent at once, against a real
// tracker on loopback: while eight 32 MiB submissions are half sent, the
// tracker's heap (this process's) holds a small part of them, their bytes
// being in the module store's spool; another user's small job is
// accepted; the same user's submission that would pass its byte cap is
// refused at once naming the cap, leaving no spool behind; one cut off
// halfway leaves none either and gives its charge back; one for a target
// no compiler node builds fails at once, its module not kept. Once sent, the
// modules are queued, each with the digest of its bytes, and the compiler
// node running one reads it back streamed (and no other node can).
func TestStreamedSubmitsStayOutOfTheHeap(t *testing.T) {
	const (
		n    = 8
		size = 32 << 20
		half = size / 2
	)
	cfg := identityConfig(t)
	cfg.MaxModuleSize = 256 << 20
	cfg.MaxQueuedBytes = 1 << 30
	cfg.MaxQueuedBytesPerUser = n*size + 40<<20
	aliceTok, err := CreateUserToken(cfg.UsersFile, "alice", "client")
	check.NoError(t, err)
	bobTok, err := CreateUserToken(cfg.UsersFile, "bob", "client")
	check.NoError(t, err)
	a := startTracker(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute) // bounds the test, not a measure
	defer cancel()
	as := func(tok string) *client.Tracker {
		tc, err := client.DialTracker(ctx, a.Addr(), client.TrackerOptions{Token: tok, Logger: quietLogger()})
		check.NoError(t, err)
		t.Cleanup(func() { tc.Close() })
		return tc
	}
	alice, bob := as(aliceTok), as(bobTok)
	node := func() *client.Registrar {
		r := client.NewRegistrar(a.Addr(), client.TrackerOptions{Token: cfg.Token, Logger: quietLogger()},
			proto.RegisterArgs{Role: proto.NodeCompiler, Attrs: proto.NodeAttrs{Targets: []string{"cpu"}, Compiler: "gcc 12"}})
		runRegistrar(t, r)
		return r
	}
	cpu, other := node(), node()
	want := genSHA256(t, size)

	base := heapInuse()
	gate := make(chan struct{})
	var wg sync.WaitGroup
	jobs := make([]proto.BuildJob, n)
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			g := &moduleGen{ctx: ctx, size: size, gateAt: half, gate: gate}
			jobs[i], errs[i] = alice.SubmitBuildFrom(ctx, proto.BuildSubmitArgs{Name: "big.py", Target: "cpu"}, size, g)
		})
	}
	defer func() {
		select {
		case <-gate:
		default:
			close(gate)
		}
		wg.Wait()
	}()
	arrived := func(min int64, count int) bool {
		got := 0
		for _, sz := range spooled(t, cfg.DataDir) {
			if sz >= min {
				got++
			}
		}
		return got == count
	}
	eventually(t, "half of each module in the spool", func() bool { return arrived(half, n) })
	inflight := heapInuse() - base
	t.Logf("heap in use with %d × %d MiB submissions half sent: %.1f MiB over the %.1f MiB before (their bytes so far: %d MiB)",
		n, size>>20, float64(inflight)/(1<<20), float64(base)/(1<<20), n*half>>20)
	check.True(t, inflight < n*size/8, "the heap grew by", inflight, "bytes with", n, "modules half sent: the tracker holds them")

	// Another user's small job is taken meanwhile.
	bj, err := bob.SubmitBuild(ctx, proto.BuildSubmitArgs{Name: "small.py", Module: module, Target: "cpu"})
	check.NoError(t, err)
	check.Equal(t, bj.State, proto.JobQueued)

	// A submission that would pass alice's cap is refused before any of
	// its bytes are taken, naming the cap; so is one over the module
	// limit.
	_, err = alice.SubmitBuildFrom(ctx, proto.BuildSubmitArgs{Name: "more.py", Target: "cpu"}, 64<<20, &moduleGen{ctx: ctx, size: 64 << 20})
	check.ErrorIs(t, err, proto.ErrBusy)
	check.Error(t, err, "--max-queued-bytes-per-user", `"alice"`)
	_, err = bob.SubmitBuildFrom(ctx, proto.BuildSubmitArgs{Name: "huge.py", Target: "cpu"}, 300<<20, &moduleGen{ctx: ctx, size: 300 << 20})
	check.ErrorIs(t, err, proto.ErrTooLarge)
	check.Error(t, err, "--max-module-size")
	check.Equal(t, len(spooled(t, cfg.DataDir)), n)

	// One cut off halfway leaves no spool and gives its charge back.
	cctx, ccancel := context.WithCancel(ctx)
	cut := make(chan error, 1)
	go func() {
		g := &moduleGen{ctx: cctx, size: size, gateAt: half, gate: make(chan struct{})}
		_, err := alice.SubmitBuildFrom(cctx, proto.BuildSubmitArgs{Name: "cut.py", Target: "cpu"}, size, g)
		cut <- err
	}()
	eventually(t, "the cut submission half in the spool", func() bool { return arrived(half, n+1) })
	ccancel()
	check.True(t, <-cut != nil, "a submission cut off halfway succeeded")
	eventually(t, "the cut submission's spool removed", func() bool { return len(spooled(t, cfg.DataDir)) == n })
	eventually(t, "the cut submission's charge given back", func() bool {
		a.mu.Lock()
		defer a.mu.Unlock()
		return a.pending.byOwner["alice"] == pendingOwner{jobs: n, bytes: n * size}
	})

	// One that no compiler node builds fails at once, its module not kept.
	fj, err := alice.SubmitBuildFrom(ctx, proto.BuildSubmitArgs{Name: "gpu.py", Target: "cuda"}, 2<<20, &moduleGen{ctx: ctx, size: 2 << 20})
	check.NoError(t, err)
	check.Equal(t, fj.State, proto.JobFailed)
	check.Error(t, errorString(fj.Error), "cuda")

	close(gate)
	wg.Wait()
	for i := range n {
		check.NoError(t, errs[i])
		check.Equal(t, jobs[i].State, proto.JobQueued)
		check.Equal(t, jobs[i].ModuleSize, int64(size))
		check.Equal(t, jobs[i].ModuleSHA256, want)
	}
	check.Equal(t, len(spooled(t, cfg.DataDir)), 0)
	check.Equal(t, len(moduleFiles(t, cfg.DataDir)), n+1)
	a.mu.Lock()
	check.Equal(t, a.pending.jobs, 0)
	a.mu.Unlock()
	t.Logf("heap in use once queued: %.1f MiB over the start", float64(heapInuse()-base)/(1<<20))

	// The node that takes a job reads its module back streamed, whole;
	// another node is told it is not there.
	var got *proto.BuildJob
	for range 2 { // bob's small job (queued first) and one of alice's
		j, err := cpu.TakeJob(ctx, time.Second)
		check.NoError(t, err)
		check.True(t, j != nil, "no job taken")
		if j.Owner == "alice" {
			got = j
			break
		}
		check.Equal(t, j.Module, module) // a small one comes inline
		check.NoError(t, cpu.FailJob(ctx, j.ID, "planned", ""))
	}
	check.True(t, got != nil, "the compiler node took none of alice's jobs")
	check.Equal(t, got.Module, "")
	check.Equal(t, got.ModuleSize, int64(size))
	check.Equal(t, got.ModuleSHA256, want)
	check.NoError(t, cpu.FetchModule(ctx, got, io.Discard))
	err = other.FetchModule(ctx, got, io.Discard)
	check.ErrorIs(t, err, proto.ErrNotFound)

	// One frame carries a module of up to MaxInlineModule bytes; the SDK
	// streams a larger one.
	raw, err := rawDial(t, a.Addr(), bobTok, proto.RoleClient)
	check.NoError(t, err)
	over := strings.Repeat("#", proto.MaxInlineModule+1)
	err = raw.Call(ctx, proto.MethodBuildSubmit, proto.BuildSubmitArgs{Module: over, Target: "cpu"}, nil)
	check.ErrorIs(t, err, proto.ErrTooLarge)
	check.Error(t, err, "inline", proto.BulkBuildSubmit)
	sj, err := bob.SubmitBuild(ctx, proto.BuildSubmitArgs{Name: "over.py", Module: over, Target: "cpu"})
	check.NoError(t, err)
	check.Equal(t, sj.ModuleSize, int64(len(over)))
}
