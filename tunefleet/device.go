package tunefleet

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/kiln-ml/kiln/client"
	"github.com/kiln-ml/kiln/compiler/tune"
	"github.com/kiln-ml/kiln/devices"
	"github.com/kiln-ml/kiln/rpcserver/proto"
	"github.com/kiln-ml/kiln/rpcserver/timer"
)

// device is one leased device and its session. Its fields change only in
// the goroutine that took it from the pool (name also under Runner.mu).
type device struct {
	name  string
	lease *client.Lease
	gen   int // the tracker connection the lease came from
	sess  *client.Session
	attrs map[string]string
	// arrays of the workload last measured here
	task   string
	arrays []*client.Array
	idle   time.Time // when it went back to the pool
}

// lease leases a device through the current tracker connection (redialed
// when it failed) and opens a session on it, into d.
func (r *Runner) lease(ctx context.Context, d *device) error {
	for try := 0; ; try++ {
		tc, gen := r.tracker()
		l, err := tc.RequestLease(ctx, client.LeaseRequest{Key: r.cfg.Key, User: r.cfg.User, TTL: r.cfg.LeaseTTL})
		if trackerLost(ctx, err) && try < buildRetries {
			if rerr := r.reconnect(ctx, gen, err); rerr != nil {
				return rerr
			}
			continue
		}
		if err != nil {
			return err
		}
		if err := r.connect(ctx, d, l, gen); err != nil {
			// Tell the tracker, which takes a device that fails
			// repeatedly out of the pool.
			l.ReportFailure(context.WithoutCancel(ctx), fmt.Sprintf("kiln tune could not open a session: %v", err))
			l.Release(context.WithoutCancel(ctx))
			return fmt.Errorf("device %s: %w", l.Addr, err)
		}
		return nil
	}
}

// connect opens a session on l's device and makes it d's.
func (r *Runner) connect(ctx context.Context, d *device, l *client.Lease, gen int) error {
	s, err := client.Connect(ctx, l.Addr, client.SessionOptions{TLS: r.cfg.TLS, LeaseToken: l.Token, Logger: r.cfg.Logger})
	if err != nil {
		return err
	}
	if d.attrs == nil || d.attrs["addr"] != l.Addr {
		d.attrs = map[string]string{"key": r.cfg.Key, "addr": l.Addr}
		if a, err := s.DeviceAttrs(ctx); err == nil {
			d.attrs["arch"], d.attrs["model"] = a.Host.Arch, a.Host.Model
			d.attrs["cores"] = fmt.Sprint(a.Host.Cores)
		}
	}
	r.mu.Lock()
	d.name = l.Addr
	r.mu.Unlock()
	d.lease, d.gen, d.sess, d.task, d.arrays = l, gen, s, "", nil
	return nil
}

// ready leases d again when its lease came through a tracker connection
// that has since been redialed: the old lease is no longer renewed.
func (r *Runner) ready(ctx context.Context, d *device) error {
	if _, gen := r.tracker(); d.gen == gen {
		return nil
	}
	r.log.Info("leasing again after the tracker came back", "device", d.name)
	return r.relet(ctx, "the tracker came back", d)
}

// relet ends d's session and lease and leases a device again. The old
// lease is released through the connection it came from (kept open after
// a redial, it reaches the tracker again), so a tracker that came back
// with its state frees the device at once; only when the tracker cannot
// be told (it lost its state, or stays away) does the new request wait
// for the old lease to lapse.
func (r *Runner) relet(ctx context.Context, why string, d *device) error {
	if d.sess != nil {
		d.sess.Close()
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	if err := d.lease.Release(rctx); err != nil {
		r.log.Debug("releasing the old lease", "device", d.name, "err", err)
	}
	cancel()
	ttl := r.cfg.LeaseTTL
	if ttl <= 0 {
		ttl = time.Minute
	}
	var err error
	for try := range 3 {
		lctx, cancel := context.WithTimeout(ctx, ttl+30*time.Second)
		err = r.lease(lctx, d)
		cancel()
		if err == nil || ctx.Err() != nil {
			break
		}
		r.log.Debug("leasing again", "try", try+1, "err", err)
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
	if err != nil {
		return fmt.Errorf("%s; leasing again: %w", why, err)
	}
	return nil
}

// args are d's arrays as call arguments.
func (d *device) args() []any {
	args := make([]any, len(d.arrays))
	for i, a := range d.arrays {
		args[i] = a
	}
	return args
}

// poison fills d's output arrays with 0xff bytes (NaN for floats), so a
// kernel that skips elements shows.
func poison(ctx context.Context, d *device, ref *reference) error {
	for i, a := range d.arrays {
		if p := ref.params[i]; p.out {
			if err := a.CopyFromBytes(ctx, ref.poison[:len(p.data)]); err != nil {
				return err
			}
		}
	}
	return nil
}

// call runs fn (loaded on d by load) once with the reference's inputs and
// returns the outputs' bytes.
func call(ctx context.Context, d *device, ref *reference, fn *client.Func) ([][]byte, error) {
	if err := poison(ctx, d, ref); err != nil {
		return nil, err
	}
	if _, err := fn.Call(ctx, d.args()...); err != nil {
		return nil, err
	}
	var outs [][]byte
	for i, a := range d.arrays {
		if ref.params[i].out {
			b, err := a.ReadBytes(ctx)
			if err != nil {
				return nil, err
			}
			outs = append(outs, b)
		}
	}
	return outs, nil
}

// check runs fn once with the reference's inputs and compares its
// outputs with the reference's as they come back: msg says how the
// first output that differs differs ("" when none does); took is the
// call's time as this side saw it (the kernel and a round trip).
func check(ctx context.Context, d *device, ref *reference, fn *client.Func) (msg string, took time.Duration, err error) {
	if err := poison(ctx, d, ref); err != nil {
		return "", 0, err
	}
	start := time.Now()
	if _, err := fn.Call(ctx, d.args()...); err != nil {
		return "", 0, err
	}
	took = time.Since(start)
	for i, a := range d.arrays {
		if p := ref.params[i]; p.out {
			c := newChecker(p)
			if _, err := a.CopyTo(ctx, c); err != nil {
				return "", took, err
			}
			if msg := c.Result(); msg != "" {
				return msg, took, nil
			}
		}
	}
	return "", took, nil
}

// load uploads and loads the artifact on d and makes d's arrays hold the
// task's inputs.
func (r *Runner) load(ctx context.Context, d *device, task *tune.Task, ref *reference, art []byte) (*client.Func, error) {
	name := fmt.Sprintf("cand-%d.kiln", r.seq.Add(1))
	t := time.Now()
	if err := d.sess.Upload(ctx, name, art); err != nil {
		return nil, err
	}
	r.clock.since(StageUpload, &t)
	defer r.clock.since(StageLoad, &t)
	mod, err := d.sess.LoadModule(ctx, name)
	if err != nil {
		return nil, err
	}
	fn, err := mod.GetFunction(ctx, task.Name)
	if err != nil {
		return nil, err
	}
	if d.task != task.Workload.Hash {
		d.arrays = nil
		for _, p := range ref.params {
			a, err := d.sess.Empty(ctx, p.shape, p.dtype, devices.CPUDevice)
			if err != nil {
				return nil, err
			}
			if !p.out {
				if err := a.CopyFromBytes(ctx, p.data); err != nil {
					return nil, err
				}
			}
			d.arrays = append(d.arrays, a)
		}
		d.task = task.Workload.Hash
	}
	d.sess.Remove(ctx, name)
	return fn, nil
}

// verdict is what became of one measurement.
type verdict int

const (
	resultStands verdict = iota // valid or not
	measureAgain                // the session was lost, not by the candidate's fault
	deviceGone                  // another device measures the candidate
)

// measure runs, checks and times one built candidate on d.
func (r *Runner) measure(ctx context.Context, d *device, task *tune.Task, ref *reference, art []byte, tm timing) (tune.Result, verdict) {
	start := time.Now()
	defer func() { r.log.Debug("measured", "device", d.name, "took", time.Since(start)) }()
	res := tune.Result{Device: d.attrs}
	if err := r.ready(ctx, d); err != nil {
		res.Error = err.Error()
		return res, deviceGone
	}
	res.Device = d.attrs
	fn, err := r.load(ctx, d, task, ref, art)
	if err != nil {
		return r.failed(ctx, d, res, err)
	}
	t := time.Now()
	msg, took, err := check(ctx, d, ref, fn)
	if err != nil {
		return r.failed(ctx, d, res, err)
	}
	if msg != "" {
		res.Error, res.Stage = msg, "check"
		return res, resultStands
	}
	r.clock.since(StageCheck, &t)
	if r.stopAtCheck(task, tm, took) {
		// The check's call alone was already far slower than the best,
		// and as long as a repeat: its time is the record.
		res.Times, res.Stopped = []float64{took.Seconds()}, true
		return res, resultStands
	}
	tr, stopped, err := r.time(ctx, d, task, fn, tm)
	if err != nil {
		return r.failed(ctx, d, res, err)
	}
	if stopped {
		// Far slower than the best: its first repeat is its record.
		r.clock.since(StageTime, &t)
		res.Times, res.Stopped = tr.Results, true
		if tr.Report != nil {
			res.Verdict, res.Noise, res.CV = tr.Report.Verdict, tr.Report.Reason, tr.Report.CV
		}
		return res, resultStands
	}
	if tr.Report != nil && tr.Report.Verdict == proto.VerdictNoisy {
		// A noisy timing is not ranked as it is: the candidate is timed
		// once more and ranked on both timings' results together (a
		// timing of fewer repeats than a 95% interval needs, noisy for
		// that alone, gets its interval from the pooled samples).
		again, err := d.sess.TimeEvaluator(ctx, fn, r.cfg.Time, d.args()...)
		if err != nil {
			return r.failed(ctx, d, res, err)
		}
		tr = timer.Pool(r.cfg.Time.StableWithin, tr, again)
		res.Remeasured = true
	}
	r.clock.since(StageTime, &t)
	res.Times = tr.Results
	if tr.Report != nil {
		res.Verdict, res.Noise, res.CV = tr.Report.Verdict, tr.Report.Reason, tr.Report.CV
	}
	if len(tr.Results) > 0 {
		r.cutoff.Observe(task.Workload.Hash, tr.Median)
	}
	return res, resultStands
}

// stopAtCheck reports whether a candidate's timing ends with the call
// that checked its result, which took took (the kernel and a round
// trip, the first call after the load: cold). Only a call at least as
// long as a repeat (Config.Time's MinRepeatMS), where the first repeat
// would be that one call again, stands in for the first repeat: a
// kernel of a millisecond or less is slowed more than the cutoff's
// factor by the round trip and a cold start alone, and was recorded
// so, its repeats never timed. A candidate timed every repeat (the
// default schedule) is never stopped.
func (r *Runner) stopAtCheck(task *tune.Task, tm timing, took time.Duration) bool {
	o := r.cfg.Time
	if tm == everyRepeat || o.Repeat < 2 || took < time.Duration(o.MinRepeatMS)*time.Millisecond {
		return false
	}
	return r.cutoff.Stop(task.Workload.Hash, took.Seconds())
}

// stopAtFirst reports whether a candidate's timing ends after its first
// repeat, whose median was first (seconds per call).
func (r *Runner) stopAtFirst(task *tune.Task, tm timing, first float64) bool {
	return tm != everyRepeat && r.cutoff.Stop(task.Workload.Hash, first)
}

// time runs the time evaluator on fn: its first repeat alone, and when
// that is not already past the cutoff (stopped false) the others, pooled
// with it. Without a cutoff, with one repeat, or for a candidate timed
// every repeat, it is one timing.
func (r *Runner) time(ctx context.Context, d *device, task *tune.Task, fn *client.Func, tm timing) (tr proto.TimeResult, stopped bool, err error) {
	o := r.cfg.Time
	if r.cutoff.Factor <= 0 || o.Repeat < 2 || tm == everyRepeat {
		tr, err := d.sess.TimeEvaluator(ctx, fn, o, d.args()...)
		return tr, false, err
	}
	first := o
	first.Repeat = 1
	a, err := d.sess.TimeEvaluator(ctx, fn, first, d.args()...)
	if err != nil {
		return tr, false, err
	}
	if len(a.Results) > 0 && r.stopAtFirst(task, tm, a.Median) {
		return a, true, nil
	}
	rest := o
	rest.Repeat--
	if a.Number > rest.Number {
		rest.Number = a.Number // the first repeat found the calls a repeat needs
	}
	b, err := d.sess.TimeEvaluator(ctx, fn, rest, d.args()...)
	if err != nil {
		return tr, false, err
	}
	return timer.Pool(o.StableWithin, a, b), false, nil
}

// failed classifies an error of a candidate's run: a crash or a failing
// kernel marks the candidate (and the session is reopened, or the device
// leased again, so the device stays in the pool); a daemon that cannot be
// reached again is the device's failure.
func (r *Runner) failed(ctx context.Context, d *device, res tune.Result, err error) (tune.Result, verdict) {
	res.Error, res.Stage = err.Error(), "run"
	if ctx.Err() != nil {
		return res, resultStands
	}
	if d.sess.Err() == nil {
		return res, resultStands // the kernel failed; the session lives
	}
	d.sess.Close()
	crashed := errors.Is(err, proto.ErrCrashed)
	if cerr := r.connect(ctx, d, d.lease, d.gen); cerr != nil {
		if _, gen := r.tracker(); !crashed && d.gen == gen {
			res.Error = fmt.Sprintf("%v; reconnecting: %v", err, cerr)
			return res, deviceGone
		}
		// The crash ended the lease's session, or the lease came from a
		// tracker connection since replaced and lapsed: lease again.
		if lerr := r.relet(ctx, err.Error(), d); lerr != nil {
			res.Error = lerr.Error()
			return res, deviceGone
		}
	}
	if crashed {
		return res, resultStands
	}
	// The session ended without a crash and the device is back: the
	// candidate was not at fault; it is measured again.
	return res, measureAgain
}
