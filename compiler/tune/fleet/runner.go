package fleet

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kiln-ml/kiln/client"
	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/script"
	"github.com/kiln-ml/kiln/compiler/tune"
	"github.com/kiln-ml/kiln/devices"
	"github.com/kiln-ml/kiln/ndarray"
	"github.com/kiln-ml/kiln/rpcserver/proto"
)

// Config says which fleet measures and how.
type Config struct {
	// Tracker is the fleet's tracker.
	Tracker *client.Tracker
	// Key is the device key to lease.
	Key string
	// Token and TLS are what the device daemons' listeners want.
	Token string
	TLS   *tls.Config
	// Target is the target string the candidates are built for.
	Target string
	// Devices caps how many devices are leased (0: every free device
	// with the key, at least one).
	Devices int
	// Time are the time evaluator's options (default: 3 repeats of at
	// least 20 ms).
	Time client.TimeOptions
	// User names the leases in the tracker's query output.
	User string
	// Logger receives debug logs (nil: discarded).
	Logger *slog.Logger
	// OnEvent, when set, is told what each device is doing.
	OnEvent func(Event)
}

// Event is a change of a device's work: InFlight candidates are on it.
type Event struct {
	Device   string
	InFlight int
	Dropped  string // why the device left the pool, when it did
}

// Runner measures candidates on leased devices; it implements
// tune.Runner. Close releases the devices.
type Runner struct {
	cfg  Config
	log  *slog.Logger
	mu   sync.Mutex
	devs []*device
	refs map[string]*reference
	seq  atomic.Int64
}

// device is one leased device and its session.
type device struct {
	name  string
	lease *client.Lease
	sess  *client.Session
	attrs map[string]string
	// arrays of the workload last measured here
	task   string
	arrays []*client.Array
}

// reference is a workload's inputs and the unscheduled function's
// outputs.
type reference struct {
	params []param
	// dflt is the unscheduled function's median time on the device that
	// computed the reference (0 when it could not be timed).
	dflt float64
}

type param struct {
	shape ndarray.Shape
	dtype ndarray.DType
	data  []byte // inputs: the values; outputs: the reference result
	out   bool
}

// Open leases the devices and opens a session on each.
func Open(ctx context.Context, cfg Config) (*Runner, error) {
	if cfg.Tracker == nil {
		return nil, errors.New("fleet: no tracker")
	}
	if cfg.Key == "" {
		return nil, errors.New("fleet: no device key")
	}
	if cfg.Time.Repeat == 0 {
		cfg.Time = client.TimeOptions{Number: 1, Repeat: 3, MinRepeatMS: 20}
	}
	r := &Runner{cfg: cfg, log: cfg.Logger, refs: map[string]*reference{}}
	if r.log == nil {
		r.log = slog.New(slog.DiscardHandler)
	}
	want := cfg.Devices
	if want <= 0 {
		s, err := cfg.Tracker.Query(ctx, 0)
		if err != nil {
			return nil, fmt.Errorf("fleet: %w", err)
		}
		for _, k := range s.Keys {
			if k.Key == cfg.Key {
				want = k.Free
			}
		}
		want = max(want, 1)
	}
	var lastErr error
	for tries := 0; len(r.devs) < want && tries < want+3; tries++ {
		lctx := ctx
		cancel := func() {}
		if len(r.devs) > 0 {
			// The first device is waited for; more are taken if free.
			lctx, cancel = context.WithTimeout(ctx, 5*time.Second)
		}
		d, err := r.lease(lctx)
		cancel()
		if err != nil {
			lastErr = err
			if ctx.Err() != nil || len(r.devs) > 0 && lctx.Err() != nil {
				break // no more free devices
			}
			continue // a device that could not be reached: try another
		}
		r.devs = append(r.devs, d)
	}
	if len(r.devs) == 0 {
		return nil, fmt.Errorf("fleet: lease a %q device: %w", cfg.Key, lastErr)
	}
	if len(r.devs) < want {
		r.log.Debug("fewer devices than asked", "got", len(r.devs), "want", want, "err", lastErr)
	}
	return r, nil
}

func (r *Runner) lease(ctx context.Context) (*device, error) {
	l, err := r.cfg.Tracker.RequestLease(ctx, client.LeaseRequest{Key: r.cfg.Key, User: r.cfg.User})
	if err != nil {
		return nil, err
	}
	d := &device{name: l.Addr, lease: l}
	if err := r.connect(ctx, d); err != nil {
		// Tell the tracker, which takes a device that fails repeatedly
		// out of the pool.
		l.ReportFailure(context.WithoutCancel(ctx), fmt.Sprintf("kiln tune could not open a session: %v", err))
		l.Release(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("device %s: %w", l.Addr, err)
	}
	return d, nil
}

func (r *Runner) connect(ctx context.Context, d *device) error {
	s, err := client.Connect(ctx, d.lease.Addr, client.SessionOptions{TLS: r.cfg.TLS, LeaseToken: d.lease.Token, Logger: r.cfg.Logger})
	if err != nil {
		return err
	}
	d.sess, d.task, d.arrays = s, "", nil
	if d.attrs == nil {
		d.attrs = map[string]string{"key": r.cfg.Key, "addr": d.lease.Addr}
		if a, err := s.DeviceAttrs(ctx); err == nil {
			d.attrs["arch"], d.attrs["model"] = a.Host.Arch, a.Host.Model
			d.attrs["cores"] = fmt.Sprint(a.Host.Cores)
		}
	}
	return nil
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

// Close ends the sessions and releases the leases.
func (r *Runner) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	var errs []error
	for _, d := range r.devs {
		if d.sess != nil {
			d.sess.Close()
		}
		if err := d.lease.Release(context.Background()); err != nil {
			errs = append(errs, err)
		}
	}
	r.devs = nil
	return errors.Join(errs...)
}

// built is a candidate after its build job.
type built struct {
	i        int
	artifact []byte
	tries    int
}

// Run builds the candidates as build jobs, all submitted at once, and
// measures each built one on the next free device.
func (r *Runner) Run(ctx context.Context, task *tune.Task, cands []*tune.Candidate) ([]tune.Result, error) {
	ref, err := r.reference(ctx, task)
	if err != nil {
		return nil, err
	}
	out := make([]tune.Result, len(cands))
	queue := make(chan built, len(cands))
	var wg sync.WaitGroup
	var pending atomic.Int64
	pending.Store(int64(len(cands)))
	done := make(chan struct{})
	finish := func() {
		if pending.Add(-1) == 0 {
			close(done)
		}
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var buildErr error
	var buildMu sync.Mutex
	for i, c := range cands {
		wg.Add(1)
		go func() {
			defer wg.Done()
			art, res, err := r.build(ctx, task, c.Func)
			switch {
			case err != nil:
				buildMu.Lock()
				buildErr = errors.Join(buildErr, err)
				buildMu.Unlock()
				cancel()
			case art == nil:
				out[i] = res
				finish()
			default:
				queue <- built{i: i, artifact: art}
			}
		}()
	}
	r.mu.Lock()
	devs := append([]*device(nil), r.devs...)
	r.mu.Unlock()
	if len(devs) == 0 {
		cancel()
		wg.Wait()
		return nil, errors.New("fleet: no device left in the pool")
	}
	var alive atomic.Int64
	alive.Store(int64(len(devs)))
	lost := make(chan struct{})
	for _, d := range devs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-ctx.Done():
					return
				case <-done:
					return
				case b := <-queue:
					r.event(d, 1, "")
					res, ok := r.measure(ctx, d, task, ref, b.artifact)
					r.event(d, 0, "")
					if ok {
						out[b.i] = res
						finish()
						continue
					}
					// The device is gone: another measures the candidate.
					queue <- b
					r.drop(d, res.Error)
					if alive.Add(-1) == 0 {
						close(lost)
					}
					return
				}
			}
		}()
	}
	select {
	case <-done:
	case <-ctx.Done():
	case <-lost:
		cancel()
		wg.Wait()
		return nil, errors.New("fleet: every device left the pool")
	}
	cancel()
	wg.Wait()
	if buildErr != nil {
		return nil, buildErr
	}
	select {
	case <-done:
		return out, nil
	default:
		return nil, context.Cause(ctx)
	}
}

func (r *Runner) event(d *device, n int, dropped string) {
	if r.cfg.OnEvent != nil {
		r.cfg.OnEvent(Event{Device: d.name, InFlight: n, Dropped: dropped})
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
	r.mu.Unlock()
	if d.sess != nil {
		d.sess.Close()
	}
	d.lease.Release(context.Background())
	r.log.Warn("device left the pool", "device", d.name, "why", why)
	r.event(d, 0, why)
}

// build submits f as a build job and downloads its artifact. A job that
// fails gives a result with stage "build" and no artifact; an error
// means the tracker could not be used.
func (r *Runner) build(ctx context.Context, task *tune.Task, f *ir.PrimFunc) ([]byte, tune.Result, error) {
	n := r.seq.Add(1)
	mod := ir.NewIRModule().With(task.Name, f.WithAttr(ir.AttrGlobalSymbol, task.Name))
	job, err := r.cfg.Tracker.SubmitBuild(ctx, proto.BuildSubmitArgs{Name: fmt.Sprintf("tune-%s-%d", task.Name, n), Module: script.Print(mod), Target: r.cfg.Target})
	if err != nil {
		return nil, tune.Result{}, fmt.Errorf("fleet: submit build: %w", err)
	}
	start := time.Now()
	job, err = r.cfg.Tracker.WaitBuild(ctx, job.ID, nil)
	r.log.Debug("build job", "job", job.ID, "node", job.Node, "state", job.State, "took", time.Since(start))
	if err != nil && !errors.Is(err, client.ErrBuildFailed) {
		return nil, tune.Result{}, fmt.Errorf("fleet: build job %s: %w", job.ID, err)
	}
	if job.State != proto.JobSucceeded {
		msg := job.Error
		if msg == "" {
			msg = string(job.State)
		}
		return nil, tune.Result{Error: msg, Stage: "build"}, nil
	}
	var art bytes.Buffer
	if _, err := r.cfg.Tracker.DownloadArtifact(ctx, job.Artifact, &art); err != nil {
		return nil, tune.Result{}, fmt.Errorf("fleet: download artifact of job %s: %w", job.ID, err)
	}
	return art.Bytes(), tune.Result{}, nil
}

// reference draws the task's inputs and computes the reference result
// with the unscheduled function, once per workload.
func (r *Runner) reference(ctx context.Context, task *tune.Task) (*reference, error) {
	r.mu.Lock()
	ref := r.refs[task.Workload.Hash]
	r.mu.Unlock()
	if ref != nil {
		return ref, nil
	}
	ref, err := newReference(task.Func)
	if err != nil {
		return nil, fmt.Errorf("fleet: %s: %w", task.Name, err)
	}
	art, res, err := r.build(ctx, task, task.Func)
	if err != nil {
		return nil, err
	}
	if art == nil {
		return nil, fmt.Errorf("fleet: %s: the unscheduled function does not build: %s", task.Name, res.Error)
	}
	r.mu.Lock()
	devs := append([]*device(nil), r.devs...)
	r.mu.Unlock()
	for _, d := range devs {
		outs, err := r.call(ctx, d, task, ref, art)
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return nil, fmt.Errorf("fleet: %s: the unscheduled function failed on %s: %w", task.Name, d.name, err)
		}
		k := 0
		for i := range ref.params {
			if ref.params[i].out {
				ref.params[i].data = outs[k]
				k++
			}
		}
		if fn, err := r.load(ctx, d, task, ref, art); err == nil {
			args := make([]any, len(d.arrays))
			for i, a := range d.arrays {
				args[i] = a
			}
			if t, err := d.sess.TimeEvaluator(ctx, fn, r.cfg.Time, args...); err == nil {
				ref.dflt = t.Median
			}
		}
		r.mu.Lock()
		r.refs[task.Workload.Hash] = ref
		r.mu.Unlock()
		return ref, nil
	}
	return nil, errors.New("fleet: no device left in the pool")
}

// Default returns the median time of the task's unscheduled function on
// the device that computed its reference (false before the task's first
// batch, or when it could not be timed).
func (r *Runner) Default(t *tune.Task) (float64, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	ref := r.refs[t.Workload.Hash]
	if ref == nil || ref.dflt <= 0 {
		return 0, false
	}
	return ref.dflt, true
}

// newReference draws inputs for f's parameters: uniform in [-1, 1) for
// floats, small integers otherwise. Outputs are the buffers its blocks
// write.
func newReference(f *ir.PrimFunc) (*reference, error) {
	written := map[*ir.Buffer]bool{}
	ir.Visit(f.Body, func(n ir.Node) bool {
		if b, ok := n.(*ir.Block); ok {
			for _, w := range b.Writes {
				written[w.Buffer] = true
			}
		}
		return true
	})
	rng := rand.New(rand.NewPCG(0x6b696c6e, 11))
	ref := &reference{}
	for i, p := range f.Params {
		b := f.BufferMap[p]
		if b == nil {
			return nil, fmt.Errorf("parameter %d (%q) is a scalar: tuning takes functions of buffers only", i, p.Name)
		}
		shape := make(ndarray.Shape, len(b.Shape))
		for d, e := range b.Shape {
			v, ok := ir.IsConstInt(e)
			if !ok {
				return nil, fmt.Errorf("buffer %q has the symbolic shape %v: tuning needs static shapes", b.Name, b.Shape)
			}
			shape[d] = v
		}
		dt := b.DType
		n := shape.NumElements()
		data := make([]byte, n*int64(dt.Size()))
		if !written[b] {
			if err := fill(rng, dt, data); err != nil {
				return nil, fmt.Errorf("buffer %q: %w", b.Name, err)
			}
		}
		ref.params = append(ref.params, param{shape: shape, dtype: dt, data: data, out: written[b]})
	}
	return ref, nil
}

func fill(rng *rand.Rand, dt ndarray.DType, b []byte) error {
	switch {
	case dt == ndarray.Float32:
		for i := 0; i < len(b); i += 4 {
			binary.LittleEndian.PutUint32(b[i:], math.Float32bits(float32(rng.Float64()*2-1)))
		}
	case dt == ndarray.Float64:
		for i := 0; i < len(b); i += 8 {
			binary.LittleEndian.PutUint64(b[i:], math.Float64bits(rng.Float64()*2-1))
		}
	case dt.IsInt() && dt.Lanes == 1:
		sz := dt.Size()
		for i := 0; i < len(b); i += sz {
			b[i] = byte(rng.IntN(8))
		}
	default:
		return fmt.Errorf("dtype %s is not supported by the tuner's checks", dt)
	}
	return nil
}

// call runs the artifact's function once on d with the reference's
// inputs and returns the outputs' bytes.
func (r *Runner) call(ctx context.Context, d *device, task *tune.Task, ref *reference, art []byte) ([][]byte, error) {
	fn, err := r.load(ctx, d, task, ref, art)
	if err != nil {
		return nil, err
	}
	args := make([]any, len(d.arrays))
	for i, a := range d.arrays {
		args[i] = a
		if ref.params[i].out {
			// Poison the outputs so a kernel that skips elements shows.
			poison := bytes.Repeat([]byte{0xff}, len(ref.params[i].data))
			if err := a.CopyFromBytes(ctx, poison); err != nil {
				return nil, err
			}
		}
	}
	if _, err := fn.Call(ctx, args...); err != nil {
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

// load uploads and loads the artifact on d and makes d's arrays hold the
// task's inputs.
func (r *Runner) load(ctx context.Context, d *device, task *tune.Task, ref *reference, art []byte) (*client.Func, error) {
	name := fmt.Sprintf("cand-%d.kiln", r.seq.Add(1))
	if err := d.sess.Upload(ctx, name, art); err != nil {
		return nil, err
	}
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

// measure runs, checks and times one built candidate on d. ok is false
// when the device itself failed (its daemon is gone), not the candidate.
func (r *Runner) measure(ctx context.Context, d *device, task *tune.Task, ref *reference, art []byte) (tune.Result, bool) {
	start := time.Now()
	defer func() { r.log.Debug("measured", "device", d.name, "took", time.Since(start)) }()
	res := tune.Result{Device: d.attrs}
	outs, err := r.call(ctx, d, task, ref, art)
	if err != nil {
		return r.failed(ctx, d, res, err)
	}
	k := 0
	for _, p := range ref.params {
		if !p.out {
			continue
		}
		if msg := compare(p, outs[k]); msg != "" {
			res.Error, res.Stage = msg, "check"
			return res, true
		}
		k++
	}
	fn, err := r.load(ctx, d, task, ref, art)
	if err != nil {
		return r.failed(ctx, d, res, err)
	}
	args := make([]any, len(d.arrays))
	for i, a := range d.arrays {
		args[i] = a
	}
	t, err := d.sess.TimeEvaluator(ctx, fn, r.cfg.Time, args...)
	if err != nil {
		return r.failed(ctx, d, res, err)
	}
	res.Times = t.Results
	return res, true
}

// failed classifies an error of a candidate's run: a crash or a failing
// kernel marks the candidate (and the session is reopened, so the device
// stays in the pool); a daemon that cannot be reached again is the
// device's failure.
func (r *Runner) failed(ctx context.Context, d *device, res tune.Result, err error) (tune.Result, bool) {
	res.Error, res.Stage = err.Error(), "run"
	if ctx.Err() != nil {
		return res, true
	}
	if d.sess.Err() == nil {
		return res, true // the kernel failed; the session lives
	}
	d.sess.Close()
	if cerr := r.connect(ctx, d); cerr != nil {
		if !errors.Is(err, proto.ErrCrashed) {
			res.Error = fmt.Sprintf("%v; reconnecting: %v", err, cerr)
			return res, false
		}
		// The crash ended the lease's session: lease again.
		d.lease.Release(context.WithoutCancel(ctx))
		lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		nd, lerr := r.lease(lctx)
		cancel()
		if lerr != nil {
			res.Error = fmt.Sprintf("%v; leasing again: %v", err, lerr)
			return res, false
		}
		d.lease, d.sess, d.task, d.arrays = nd.lease, nd.sess, "", nil
	}
	if errors.Is(err, proto.ErrCrashed) {
		return res, true
	}
	// The session ended without a crash (connection lost): if the
	// daemon came back, the candidate was not at fault; measure it again.
	return res, false
}

// compare checks an output against the reference: within 1e-3 of the
// reference's magnitude (plus 1e-3) for floats, exactly for integers.
func compare(p param, got []byte) string {
	if len(got) != len(p.data) {
		return fmt.Sprintf("output has %d bytes, want %d", len(got), len(p.data))
	}
	switch p.dtype {
	case ndarray.Float32, ndarray.Float64:
		sz := p.dtype.Size()
		for i := 0; i < len(got); i += sz {
			var g, w float64
			if sz == 4 {
				g = float64(math.Float32frombits(binary.LittleEndian.Uint32(got[i:])))
				w = float64(math.Float32frombits(binary.LittleEndian.Uint32(p.data[i:])))
			} else {
				g = math.Float64frombits(binary.LittleEndian.Uint64(got[i:]))
				w = math.Float64frombits(binary.LittleEndian.Uint64(p.data[i:]))
			}
			if !(math.Abs(g-w) <= 1e-3*(1+math.Abs(w))) && !(math.IsNaN(w) && math.IsNaN(g)) {
				return fmt.Sprintf("wrong result: element %d is %g, the reference says %g", i/sz, g, w)
			}
		}
	default:
		if i := firstDiff(got, p.data); i >= 0 {
			return fmt.Sprintf("wrong result: byte %d differs from the reference", i)
		}
	}
	return ""
}

func firstDiff(a, b []byte) int {
	for i := range a {
		if a[i] != b[i] {
			return i
		}
	}
	return -1
}
