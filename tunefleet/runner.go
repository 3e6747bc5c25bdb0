package tunefleet

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kiln-ml/kiln/client"
	"github.com/kiln-ml/kiln/compiler/tune"
)

// Config says which fleet measures and how.
type Config struct {
	// Dial connects to the fleet's tracker. The runner dials it when it
	// opens and again whenever the connection fails (a tracker that
	// restarts mid-tuning): the candidates in flight are waited for or
	// submitted again and the devices leased again. The runner closes
	// the connections it dialed.
	Dial func(ctx context.Context) (*client.Tracker, error)
	// Tracker, when Dial is nil, is a connection the runner uses as is
	// (it is not redialed, nor closed by the runner).
	Tracker *client.Tracker
	// Redial bounds how long a lost tracker is redialed before the batch
	// in flight fails (default 2 minutes).
	Redial time.Duration
	// Key is the device key to lease.
	Key string
	// Token and TLS are what the device daemons' listeners want.
	Token string
	TLS   *tls.Config
	// Target is the target string the candidates are built for.
	Target string
	// BuildTimeout bounds each candidate's build on a compiler node
	// (0: DefaultBuildTimeout); a build past it is killed and the
	// candidate recorded invalid at the build stage, never tried again.
	// The reference (the unscheduled function) builds under the
	// tracker's default limit.
	BuildTimeout time.Duration
	// Devices caps how many devices are leased (0: every free device
	// with the key, at least one).
	Devices int
	// LeaseTTL is the life of each lease between renewals (0: the
	// tracker's default). After a tracker restart the old leases are
	// released and the devices leased again at once; a tracker that came
	// back without its state makes the new requests wait for the old
	// leases to lapse, so it bounds that wait.
	LeaseTTL time.Duration
	// Time are the time evaluator's options (default: 3 repeats of at
	// least 20 ms).
	Time client.TimeOptions
	// Cutoff stops a candidate's timing after its first repeat when that
	// took over Cutoff times the best time of its workload measured by
	// this runner (see tune.Cutoff): 0 means tune.DefaultCutoff, a
	// negative value times every repeat of every candidate. The default
	// schedule's candidate is timed every repeat whatever the cutoff.
	Cutoff float64
	// NoDefault skips timing each task's unscheduled function when its
	// reference is computed (Default then reports nothing): it can be
	// slow, even timed as it is, with one repeat.
	NoDefault bool
	// User names the leases in the tracker's query output.
	User string
	// Logger receives debug logs (nil: discarded).
	Logger *slog.Logger
	// OnEvent, when set, is told what each device is doing and when the
	// tracker connection is lost and back.
	OnEvent func(Event)
}

// Event is a change of a device's work (InFlight candidates are on it),
// or a note on the fleet (Note set, Device empty).
type Event struct {
	Device   string
	InFlight int
	Dropped  string // why the device left the pool, when it did
	Note     string
}

// Runner measures candidates on leased devices; it implements
// tune.Runner. Close releases the devices.
type Runner struct {
	cfg Config
	log *slog.Logger

	mu       sync.Mutex
	tc       *client.Tracker
	gen      int               // the tracker connection's generation: +1 per redial
	replaced []*client.Tracker // earlier connections, closed by Close
	devs     []*device
	refs     map[string]*reference
	refMu    sync.Mutex // one reference computed at a time

	free     chan *device  // the pool's devices not measuring
	gone     chan struct{} // closed when the last device left the pool
	goneOnce sync.Once

	redial sync.Mutex // one redial at a time
	seq    atomic.Int64
	clock  stageClock
	cutoff *tune.Cutoff
}

// Open connects to the tracker, leases the devices and opens a session
// on each.
func Open(ctx context.Context, cfg Config) (*Runner, error) {
	if cfg.Tracker == nil && cfg.Dial == nil {
		return nil, errors.New("fleet: no tracker")
	}
	if cfg.Key == "" {
		return nil, errors.New("fleet: no device key")
	}
	if cfg.Time.Repeat == 0 {
		cfg.Time = client.TimeOptions{Number: 1, Repeat: 6, MinRepeatMS: 10}
	}
	if cfg.Redial <= 0 {
		cfg.Redial = defaultRedials
	}
	if cfg.BuildTimeout <= 0 {
		cfg.BuildTimeout = DefaultBuildTimeout
	}
	if cfg.Cutoff == 0 {
		cfg.Cutoff = tune.DefaultCutoff
	}
	r := &Runner{cfg: cfg, log: cfg.Logger, refs: map[string]*reference{}, tc: cfg.Tracker, cutoff: tune.NewCutoff(max(cfg.Cutoff, 0))}
	if r.log == nil {
		r.log = slog.New(slog.DiscardHandler)
	}
	if cfg.Dial != nil {
		tc, err := cfg.Dial(ctx)
		if err != nil {
			return nil, fmt.Errorf("fleet: %w", err)
		}
		r.tc = tc
	}
	devs, err := r.leaseAll(ctx)
	if err != nil {
		r.closeTracker()
		return nil, err
	}
	r.devs = devs
	r.free, r.gone = make(chan *device, len(devs)), make(chan struct{})
	for _, d := range devs {
		r.free <- d
	}
	return r, nil
}

// leaseAll leases cfg.Devices devices (every free one when 0, at least
// one).
func (r *Runner) leaseAll(ctx context.Context) ([]*device, error) {
	want := r.cfg.Devices
	if want <= 0 {
		tc, _ := r.tracker()
		s, err := tc.Query(ctx, 0)
		if err != nil {
			return nil, fmt.Errorf("fleet: %w", err)
		}
		for _, k := range s.Keys {
			if k.Key == r.cfg.Key {
				want = k.Free
			}
		}
		want = max(want, 1)
	}
	var devs []*device
	var lastErr error
	for tries := 0; len(devs) < want && tries < want+3; tries++ {
		lctx := ctx
		cancel := func() {}
		if len(devs) > 0 {
			// The first device is waited for; more are taken if free.
			lctx, cancel = context.WithTimeout(ctx, 5*time.Second)
		}
		d := &device{}
		err := r.lease(lctx, d)
		cancel()
		if err != nil {
			lastErr = err
			if ctx.Err() != nil || len(devs) > 0 && lctx.Err() != nil {
				break // no more free devices
			}
			continue // a device that could not be reached: try another
		}
		devs = append(devs, d)
	}
	if len(devs) == 0 {
		return nil, fmt.Errorf("fleet: lease a %q device: %w", r.cfg.Key, lastErr)
	}
	if len(devs) < want {
		r.log.Debug("fewer devices than asked", "got", len(devs), "want", want, "err", lastErr)
	}
	return devs, nil
}

// Devices returns the names (addresses) of the devices in the pool.
func (r *Runner) Devices() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, d := range r.devs {
		out = append(out, d.name)
	}
	return out
}

// Close ends the sessions, releases the leases and closes the tracker
// connection the runner dialed.
func (r *Runner) Close() error {
	r.mu.Lock()
	devs := r.devs
	r.devs = nil
	gen := r.gen
	r.mu.Unlock()
	var errs []error
	for _, d := range devs {
		if d.sess != nil {
			d.sess.Close()
		}
		// A lease of an earlier tracker connection may be unknown to a
		// tracker that came back without its state: it lapses by itself.
		if err := d.lease.Release(context.Background()); err != nil && d.gen == gen {
			errs = append(errs, err)
		}
	}
	r.closeTracker()
	return errors.Join(errs...)
}

func (r *Runner) closeTracker() {
	if r.cfg.Dial == nil {
		return
	}
	r.mu.Lock()
	tcs := append([]*client.Tracker{r.tc}, r.replaced...)
	r.replaced = nil
	r.mu.Unlock()
	for _, tc := range tcs {
		if tc != nil {
			tc.Close()
		}
	}
}

// maxTries bounds how many times a candidate whose session ended (not a
// crash) is measured again before its last error is its result.
const maxTries = 2

// Stream builds the candidates as build jobs, all submitted at once, and
// measures each on the next free device of the pool the moment its build
// is done, giving each result to each as it comes; it implements
// tune.Runner. Streams may run at once (the search keeps a pipeline of
// them): they share the devices, each measuring one candidate at a time.
// When ctx ends the build jobs still queued are cancelled at the tracker
// and the measurements under way dropped.
func (r *Runner) Stream(ctx context.Context, task *tune.Task, cands []*tune.Candidate, each func(int, tune.Result)) error {
	return r.run(ctx, task, len(cands), 0, func(ctx context.Context, i int) ([]byte, tune.Result, timing, error) {
		art, res, err := r.build(ctx, task, cands[i].Func)
		return art, res, timingOf(cands[i]), err
	}, each)
}

// StreamAlone is Stream with every candidate built first, then timed one
// after the other on one device of the pool (the others idle), so that
// neither a build nor another timing shares the machine with a timing
// (tune.AloneRunner: the head-to-heads time so).
func (r *Runner) StreamAlone(ctx context.Context, task *tune.Task, cands []*tune.Candidate, each func(int, tune.Result)) error {
	bs, err := r.Build(ctx, task, cands)
	if err != nil {
		return err
	}
	return r.run(ctx, task, len(bs), 1, func(_ context.Context, i int) ([]byte, tune.Result, timing, error) {
		return bs[i].Artifact, bs[i].Result, bs[i].timing, nil
	}, each)
}

// timing says how a candidate is timed: every repeat, or cut short when
// it is far slower than the best (see Runner.stopAtCheck and
// Runner.stopAtFirst).
type timing int

const (
	cutoffApplies timing = iota
	// everyRepeat: the default schedule is the figure the search's best
	// is compared with (and that a head-to-head pits it against), so it
	// is never cut short, whatever was timed before it.
	everyRepeat
)

func timingOf(c *tune.Candidate) timing {
	if c.Schedule == tune.DefaultSchedule {
		return everyRepeat
	}
	return cutoffApplies
}

// Run is Stream with the results in order, once every candidate has one.
func (r *Runner) Run(ctx context.Context, task *tune.Task, cands []*tune.Candidate) ([]tune.Result, error) {
	out := make([]tune.Result, len(cands))
	if err := r.Stream(ctx, task, cands, func(i int, res tune.Result) { out[i] = res }); err != nil {
		return nil, err
	}
	return out, nil
}

// Built is a candidate after its build job: its artifact, or (Artifact
// nil) the result of a build that failed.
type Built struct {
	Artifact []byte
	Result   tune.Result
	timing   timing
}

// Build builds the candidates as build jobs, all submitted at once, and
// waits for every one. Measure then measures them: the two halves of Run,
// for a caller that times the devices alone.
func (r *Runner) Build(ctx context.Context, task *tune.Task, cands []*tune.Candidate) ([]Built, error) {
	out := make([]Built, len(cands))
	errs := make([]error, len(cands))
	var wg sync.WaitGroup
	for i, c := range cands {
		wg.Go(func() {
			out[i].Artifact, out[i].Result, errs[i] = r.build(ctx, task, c.Func)
			out[i].timing = timingOf(c)
		})
	}
	wg.Wait()
	return out, errors.Join(errs...)
}

// Measure measures what Build built on the devices, as Run does.
func (r *Runner) Measure(ctx context.Context, task *tune.Task, bs []Built) ([]tune.Result, error) {
	return r.MeasureOn(ctx, task, bs, 0)
}

// MeasureOn is Measure on k devices of the pool at once (all of them
// when k is 0): the others stay leased and idle, so a caller can compare
// the throughput of k devices with that of more without leasing again.
func (r *Runner) MeasureOn(ctx context.Context, task *tune.Task, bs []Built, k int) ([]tune.Result, error) {
	out := make([]tune.Result, len(bs))
	err := r.run(ctx, task, len(bs), k, func(_ context.Context, i int) ([]byte, tune.Result, timing, error) {
		return bs[i].Artifact, bs[i].Result, bs[i].timing, nil
	}, func(i int, res tune.Result) { out[i] = res })
	if err != nil {
		return nil, err
	}
	return out, nil
}

// run measures n candidates on at most limit devices at once (no bound
// when 0): get(i) gives the artifact of the i-th (or the result of its
// failed build), called concurrently for all of them; each gets every
// result as it comes. The first error (the tracker, the fleet gone, ctx)
// stops the others; the results given before stand.
func (r *Runner) run(ctx context.Context, task *tune.Task, n, limit int, get func(ctx context.Context, i int) ([]byte, tune.Result, timing, error), each func(int, tune.Result)) error {
	if n == 0 {
		return nil
	}
	ref, err := r.reference(ctx, task)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var slots chan struct{}
	if limit > 0 {
		slots = make(chan struct{}, limit)
	}
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			art, res, tm, err := get(ctx, i)
			if err == nil && art != nil {
				res, err = r.measureOnPool(ctx, task, ref, art, tm, slots)
			}
			if err != nil {
				cancel(err)
				return
			}
			each(i, res)
		})
	}
	wg.Wait()
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	return nil
}

// measureOnPool measures one built candidate on the next free device
// (another when that one is gone, the same again when its session ended
// through no fault of the candidate's).
func (r *Runner) measureOnPool(ctx context.Context, task *tune.Task, ref *reference, art []byte, tm timing, slots chan struct{}) (tune.Result, error) {
	if slots != nil {
		select {
		case slots <- struct{}{}:
			defer func() { <-slots }()
		case <-ctx.Done():
			return tune.Result{}, ctx.Err()
		}
	}
	for tries := 0; ; {
		d, err := r.acquire(ctx)
		if err != nil {
			return tune.Result{}, err
		}
		r.event(d, 1, "")
		res, v := r.measure(ctx, d, task, ref, art, tm)
		r.event(d, 0, "")
		if ctx.Err() != nil {
			// Cut short: not the candidate's result.
			r.release(d)
			return tune.Result{}, ctx.Err()
		}
		switch {
		case v == deviceGone:
			// Another device measures the candidate.
			r.drop(d, res.Error)
		case v == measureAgain && tries < maxTries:
			tries++
			r.release(d)
		default:
			r.release(d)
			return res, nil
		}
	}
}

// acquire takes the next free device of the pool.
func (r *Runner) acquire(ctx context.Context) (*device, error) {
	select {
	case d := <-r.free:
		if !d.idle.IsZero() {
			r.clock.add(StageWait, time.Since(d.idle))
		}
		return d, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-r.gone:
		return nil, errors.New("fleet: every device left the pool")
	}
}

// release puts d back in the pool.
func (r *Runner) release(d *device) {
	d.idle = time.Now()
	r.free <- d
}

func (r *Runner) event(d *device, n int, dropped string) {
	if r.cfg.OnEvent != nil {
		r.cfg.OnEvent(Event{Device: d.name, InFlight: n, Dropped: dropped})
	}
}

// note tells OnEvent about the fleet.
func (r *Runner) note(msg string) {
	if r.cfg.OnEvent != nil {
		r.cfg.OnEvent(Event{Note: msg})
	}
}

func (r *Runner) drop(d *device, why string) {
	r.mu.Lock()
	for i, x := range r.devs {
		if x == d {
			r.devs = append(r.devs[:i], r.devs[i+1:]...)
			break
		}
	}
	if len(r.devs) == 0 {
		r.goneOnce.Do(func() { close(r.gone) })
	}
	r.mu.Unlock()
	if d.sess != nil {
		d.sess.Close()
	}
	d.lease.Release(context.Background())
	r.log.Warn("device left the pool", "device", d.name, "why", why)
	r.event(d, 0, why)
}
