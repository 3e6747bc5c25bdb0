package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/kiln-ml/kiln/client"
	"github.com/kiln-ml/kiln/rpcserver/proto"
)

// ledger checks the leases clients receive: a device's holder is set when
// a lease on it arrives and cleared before that lease is released, so a
// device that arrives while held was granted twice. It also keeps each
// grant's time on the tracker's clock (a lease's Expires less its TTL).
type ledger struct {
	mu     sync.Mutex
	holder map[string]string // node id → lease id
	twice  []string
	grants []time.Time
	errs   []error
}

func newLedger() *ledger { return &ledger{holder: make(map[string]string)} }

// cycle requests a lease on key, records it and releases it.
func (lg *ledger) cycle(ctx context.Context, tc *client.Tracker, key string) (time.Duration, error) {
	t0 := time.Now()
	l, err := tc.RequestLease(ctx, client.LeaseRequest{Key: key, NoRenew: true, TTL: time.Minute})
	took := time.Since(t0)
	if err != nil {
		return took, err
	}
	lg.mu.Lock()
	if other, held := lg.holder[l.NodeID]; held {
		lg.twice = append(lg.twice, fmt.Sprintf("device %s: lease %s granted while %s held it", l.NodeID, l.ID, other))
	}
	lg.holder[l.NodeID] = l.ID
	lg.grants = append(lg.grants, l.Expires.Add(-l.TTL))
	delete(lg.holder, l.NodeID)
	lg.mu.Unlock()
	return took, l.Release(ctx)
}

// firstGrantAfter returns the earliest grant made after t, false when none.
func (lg *ledger) firstGrantAfter(t time.Time) (time.Time, bool) {
	lg.mu.Lock()
	defer lg.mu.Unlock()
	var first time.Time
	for _, g := range lg.grants {
		if g.After(t) && (first.IsZero() || g.Before(first)) {
			first = g
		}
	}
	return first, !first.IsZero()
}

// leaseLoop runs lease cycles from every client until ctx ends; a cycle's
// error is noted and the client carries on.
func (lg *ledger) leaseLoop(ctx context.Context, tcs []*client.Tracker, keys int) *sync.WaitGroup {
	var wg sync.WaitGroup
	for w, tc := range tcs {
		wg.Go(func() {
			for i := w; ctx.Err() == nil; i += len(tcs) {
				if _, err := lg.cycle(ctx, tc, fmt.Sprintf("key%d", i%keys)); err != nil && ctx.Err() == nil {
					lg.mu.Lock()
					lg.errs = append(lg.errs, err)
					lg.mu.Unlock()
				}
			}
		})
	}
	return &wg
}

// jobBook runs build jobs through simulated compiler nodes and counts what
// became of each: submitted (acknowledged by a tracker), completed (a
// compiler node's CompleteJob accepted; more than once is a duplicate).
type jobBook struct {
	mu        sync.Mutex
	submitted []string
	completed map[string]int
	errs      []error
}

func newJobBook() *jobBook { return &jobBook{completed: make(map[string]int)} }

// compile takes and completes jobs on r until ctx ends: the artifact is
// the job id's bytes.
func (jb *jobBook) compile(ctx context.Context, r *client.Registrar) {
	for ctx.Err() == nil {
		j, err := r.TakeJob(ctx, time.Second)
		if err != nil || j == nil {
			continue
		}
		art := []byte("artifact of " + j.ID)
		sum := sha256.Sum256(art)
		sha := hex.EncodeToString(sum[:])
		if err := r.UploadArtifact(ctx, sha, int64(len(art)), bytes.NewReader(art)); err != nil {
			continue
		}
		if err := r.CompleteJob(ctx, j.ID, sha, ""); err != nil {
			continue // no longer this node's (requeued by a failover): another try builds it
		}
		jb.mu.Lock()
		jb.completed[j.ID]++
		jb.mu.Unlock()
	}
}

// submitLoop submits a job every gap until ctx ends.
func (jb *jobBook) submitLoop(ctx context.Context, tc *client.Tracker, gap time.Duration) {
	for i := 0; ctx.Err() == nil; i++ {
		j, err := tc.SubmitBuild(ctx, proto.BuildSubmitArgs{Name: fmt.Sprintf("ha-%d", i), Module: fmt.Sprintf("# job %d\n", i), Target: "cpu"})
		jb.mu.Lock()
		if err == nil {
			jb.submitted = append(jb.submitted, j.ID)
		} else if ctx.Err() == nil {
			jb.errs = append(jb.errs, err)
		}
		jb.mu.Unlock()
		select {
		case <-ctx.Done():
		case <-time.After(gap):
		}
	}
}

// settle waits (up to within) until every submitted job is final and
// returns how many did not succeed (lost) and how many were completed
// more than once.
func (jb *jobBook) settle(ctx context.Context, tc *client.Tracker, within time.Duration) (lost, twice int, err error) {
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	jb.mu.Lock()
	ids := slices.Clone(jb.submitted)
	jb.mu.Unlock()
	for _, id := range ids {
		j, err := tc.WaitBuild(ctx, id, nil)
		if err != nil && !errors.Is(err, client.ErrBuildFailed) {
			return 0, 0, fmt.Errorf("wait for job %s: %w", id, err)
		}
		if j.State != proto.JobSucceeded {
			lost++
		}
	}
	jb.mu.Lock()
	defer jb.mu.Unlock()
	for _, n := range jb.completed {
		if n > 1 {
			twice++
		}
	}
	return lost, twice, nil
}

// startCompilers registers n simulated compiler nodes (target cpu) that
// build through jb until ctx ends.
func startCompilers(ctx context.Context, list, token string, n int, jb *jobBook) (*sync.WaitGroup, error) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	var wg sync.WaitGroup
	for range n {
		r := client.NewRegistrar(list, client.TrackerOptions{Token: token, Logger: quiet},
			proto.RegisterArgs{Role: proto.NodeCompiler, Attrs: proto.NodeAttrs{Targets: []string{"cpu"}}})
		wg.Go(func() { r.Run(ctx) })
		select {
		case <-r.Ready():
		case <-time.After(time.Minute):
			return &wg, errors.New("a compiler node did not register within a minute")
		}
		wg.Go(func() { jb.compile(ctx, r) })
	}
	return &wg, nil
}
