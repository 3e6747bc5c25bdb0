package tunefleet

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/kiln-ml/kiln/client"
	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/script"
	"github.com/kiln-ml/kiln/compiler/tune"
	"github.com/kiln-ml/kiln/rpcserver/proto"
)

// Backoff of the redials after the tracker connection failed: the first
// wait, the longest, and how many times a build is retried over
// reconnects before its candidate's batch fails.
const (
	redialFirst    = 100 * time.Millisecond
	redialMax      = 5 * time.Second
	buildRetries   = 5
	defaultRedials = 2 * time.Minute
)

// DefaultBuildTimeout is a candidate's build limit unless Config says
// otherwise: a candidate that takes longer to compile than this is not
// worth its compile time (kiln tune --build-timeout).
const DefaultBuildTimeout = time.Minute

// errJobLost is buildOn's error for a job the tracker does not know (it
// restarted without its state): the job is submitted again.
var errJobLost = errors.New("the tracker does not know the job")

// tracker returns the current tracker connection and its generation
// (how many times it was redialed).
func (r *Runner) tracker() (*client.Tracker, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.tc, r.gen
}

// trackerLost reports whether err means the tracker connection is gone
// (and not that ctx ended or the tracker refused the call).
func trackerLost(ctx context.Context, err error) bool {
	return err != nil && ctx.Err() == nil && errors.Is(err, proto.ErrUnavailable)
}

// reconnect replaces the tracker connection of generation gen, which
// failed with cause, by a fresh dial, retried with a bounded exponential
// backoff for at most cfg.Redial. Concurrent callers wait for one
// redial; a caller whose generation was replaced already returns at
// once. Devices leased through the old connection are leased again
// through the new one before their next measurement (see ready); the old
// connection is kept until Close for their releases.
func (r *Runner) reconnect(ctx context.Context, gen int, cause error) error {
	r.redial.Lock()
	defer r.redial.Unlock()
	if _, cur := r.tracker(); cur != gen {
		return nil
	}
	if r.cfg.Dial == nil {
		return fmt.Errorf("fleet: the tracker connection failed: %w", cause)
	}
	r.log.Warn("tracker connection lost; redialing", "err", cause)
	r.note(fmt.Sprintf("tracker connection lost (%v); redialing", cause))
	start := time.Now()
	wait := redialFirst
	for attempt := 1; ; attempt++ {
		dctx, cancel := context.WithTimeout(ctx, redialMax)
		tc, err := r.cfg.Dial(dctx)
		cancel()
		if err == nil {
			// The old connection stays open (it redials by itself when
			// used): the devices leased through it release their leases
			// through it before leasing again (see relet), so the
			// tracker, back with its state, frees them at once.
			r.mu.Lock()
			r.replaced = append(r.replaced, r.tc)
			r.tc, r.gen = tc, r.gen+1
			r.mu.Unlock()
			took := time.Since(start).Round(time.Millisecond)
			r.log.Info("tracker back", "after", took, "dials", attempt)
			r.note(fmt.Sprintf("tracker back after %s; leasing the devices again and resubmitting the candidates in flight", took))
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if time.Since(start)+wait > r.cfg.Redial {
			return fmt.Errorf("fleet: the tracker has been unreachable for %s (%d dials; the records measured so far are kept): %w",
				time.Since(start).Round(time.Second), attempt, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
		wait = min(2*wait, redialMax)
	}
}

// build submits f as a build job and downloads its artifact. A job that
// fails gives a result with stage "build" and no artifact; an error
// means the tracker could not be used. When the tracker connection
// fails, the tracker is redialed and the job waited for again (the
// tracker keeps its jobs over a restart), or submitted again if the
// tracker no longer knows it.
//
// Candidates are bulk jobs (a person's kiln build goes first), limited
// to cfg.BuildTimeout, and cancelled at the tracker when ctx ends or, if
// this process dies, when its connection has been gone for the tracker's
// grace period.
func (r *Runner) build(ctx context.Context, task *tune.Task, f *ir.PrimFunc) ([]byte, tune.Result, error) {
	return r.buildJob(ctx, task, f, r.cfg.BuildTimeout)
}

// buildJob is build under the run limit limit (0: the tracker's default).
func (r *Runner) buildJob(ctx context.Context, task *tune.Task, f *ir.PrimFunc, limit time.Duration) ([]byte, tune.Result, error) {
	n := r.seq.Add(1)
	mod := ir.NewIRModule().With(task.Name, f.WithAttr(ir.AttrGlobalSymbol, task.Name))
	// The node builds the candidate as it is: a default schedule on top
	// would measure another function than the record says.
	args := proto.BuildSubmitArgs{Name: fmt.Sprintf("tune-%s-%d", task.Name, n), Module: script.Print(mod), Target: r.cfg.Target,
		Options: map[string]string{"default-schedule": "none"}, RunTimeout: limit, Class: proto.JobBulk, CancelOnDisconnect: true}
	id := ""
	for try := 0; ; try++ {
		tc, gen := r.tracker()
		art, res, err := r.buildOn(ctx, tc, args, &id)
		if try >= buildRetries || !trackerLost(ctx, err) && !errors.Is(err, errJobLost) {
			return art, res, err
		}
		if errors.Is(err, errJobLost) {
			r.log.Debug("build job lost by the tracker; submitting it again", "err", err)
			continue
		}
		if rerr := r.reconnect(ctx, gen, err); rerr != nil {
			return nil, tune.Result{}, rerr
		}
	}
}

// buildOn is one attempt of build through tc; *id is the job's id once
// submitted (cleared when the tracker does not know it).
func (r *Runner) buildOn(ctx context.Context, tc *client.Tracker, args proto.BuildSubmitArgs, id *string) ([]byte, tune.Result, error) {
	if *id == "" {
		job, err := tc.SubmitBuild(ctx, args)
		if err != nil {
			return nil, tune.Result{}, fmt.Errorf("fleet: submit build: %w", err)
		}
		*id = job.ID
	}
	start := time.Now()
	// AwaitBuild cancels the job when ctx ends (nobody wants the
	// artifact: the compiler nodes are freed of it) and checks the
	// artifact against its sha256, as kiln build does.
	job, art, err := tc.AwaitBuild(ctx, *id, nil)
	r.log.Debug("build job", "job", *id, "node", job.Node, "state", job.State, "took", time.Since(start))
	if ctx.Err() != nil {
		return nil, tune.Result{}, ctx.Err()
	}
	if errors.Is(err, proto.ErrNotFound) && job.State != proto.JobSucceeded {
		// A tracker that lost its state: submit the job again.
		lost := *id
		*id = ""
		return nil, tune.Result{}, fmt.Errorf("fleet: build job %s: %w: %w", lost, errJobLost, err)
	}
	if err != nil && !errors.Is(err, client.ErrBuildFailed) {
		return nil, tune.Result{}, fmt.Errorf("fleet: build job %s: %w", *id, err)
	}
	if !job.Started.IsZero() {
		// The tracker's clock, both: the queue and the node's work.
		r.clock.add(StageQueue, max(job.Started.Sub(job.Submitted), 0))
		if !job.Finished.IsZero() {
			r.clock.add(StageCompile, max(job.Finished.Sub(job.Started), 0))
		}
	}
	if job.State != proto.JobSucceeded {
		msg := job.Error
		if msg == "" {
			msg = string(job.State)
		}
		if args.RunTimeout > 0 && !job.Started.IsZero() && job.Finished.Sub(job.Started) >= args.RunTimeout {
			msg = fmt.Sprintf("build timed out: over the limit of %s a candidate's build may take (kiln tune --build-timeout): %s", args.RunTimeout, msg)
		}
		return nil, tune.Result{Error: msg, Stage: "build"}, nil
	}
	return art, tune.Result{}, nil
}
