package rpcserver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/kiln-ml/kiln/rpcserver/proto"
)

// sessionState is where a session is in its life.
type sessionState int

const (
	stateConnected sessionState = iota // admitted, session.open not yet called
	stateOpening                       // session.open running
	stateOpen                          // worker running
	stateEnded                         // expired, crashed or closed: endErr says which
)

// session is one client connection and its worker.
type session struct {
	d       *Daemon
	c       *proto.Conn
	id      string
	remote  string
	started time.Time
	log     *slog.Logger

	mu        sync.Mutex
	state     sessionState
	endErr    error // why the session ended
	endHow    string
	deadline  time.Time
	timeout   time.Duration
	expiry    *time.Timer
	opener    *time.Timer // ends a session not opened in time
	closer    *time.Timer // closes the connection endGrace after the end
	dir       string
	box       *sandbox
	worker    *workerProc
	lease     string
	info      proto.SessionInfo
	inflight  map[uint64]inflightCall // call id → the call (for crash reports)
	nextCall  uint64
	funcNames map[uint64]string // function handle → name
	closed    bool
	// callTicket admits the client's call connection (see
	// proto.SessionInfo.CallTicket); counted holds the call board's
	// counters already added to the daemon's metrics.
	callTicket string
	counted    [boardMethods][boardCodes]uint64
	// jail is the session's uid and cgroups (see isolation); confined
	// says they are to be given back.
	jail     jailing
	confined bool

	// leaseToken is the lease token the session opened with (it admits
	// the session's call and bulk connections of a client without the
	// fleet token); helloLease is the lease token the client's hello
	// carried in place of the fleet token ("" when it carried the fleet
	// token); user is the lease's user.
	leaseToken string
	helloLease string
	user       string
	// unleased says the session holds its slot under no lease (set by
	// Daemon.take, under the daemon's lock).
	unleased bool
	// gpu is the index in d.gpus of the GPU the session's worker alone
	// sees (set when it takes its slot); -1: it sees the daemon's GPUs.
	gpu int
}

func newSession(d *Daemon, c *proto.Conn, id string) *session {
	s := &session{
		d: d, c: c, id: id, remote: c.RemoteAddr().String(), started: time.Now(),
		log:       d.log.With("session", id, "remote", c.RemoteAddr().String()),
		inflight:  map[uint64]inflightCall{},
		funcNames: map[uint64]string{},
		gpu:       -1,
	}
	s.armDeadline(d.cfg.SessionTimeout)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.opener = time.AfterFunc(openTimeout, func() {
		s.mu.Lock()
		waiting := s.state == stateConnected
		s.mu.Unlock()
		if waiting {
			s.end("not_opened", fmt.Errorf("session %s was not opened within %s of connecting: %w", id, openTimeout, proto.ErrDeadline))
		}
	})
	return s
}

// openTimeout bounds the time between a client's hello and its
// session.open, so that an idle connection cannot hold the device.
const openTimeout = 30 * time.Second

// armDeadline (re)sets the session's deadline to timeout after its start.
func (s *session) armDeadline(timeout time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.timeout = timeout
	s.deadline = s.started.Add(timeout)
	if s.expiry != nil {
		s.expiry.Stop()
	}
	s.expiry = time.AfterFunc(time.Until(s.deadline), s.expire)
}

// errNotOpen refuses a method before session.open.
var errNotOpen = fmt.Errorf("session not open: call %s first: %w", proto.SessionOpen, proto.ErrUnauthorized)

// live returns the worker of an open session, or why there is none.
func (s *session) live() (*workerProc, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch s.state {
	case stateOpen:
		return s.worker, nil
	case stateEnded:
		return nil, s.endErr
	}
	return nil, errNotOpen
}

// liveBox returns the sandbox of an open session.
func (s *session) liveBox() (*sandbox, error) {
	if _, err := s.live(); err != nil {
		return nil, err
	}
	return s.box, nil
}

// open verifies the lease, makes the session directory and starts the worker.
func (s *session) open(ctx context.Context, a proto.OpenArgs) (proto.SessionInfo, error) {
	s.mu.Lock()
	switch s.state {
	case stateOpen:
		info := s.info
		s.mu.Unlock()
		return info, nil
	case stateOpening:
		s.mu.Unlock()
		return proto.SessionInfo{}, fmt.Errorf("session %s is being opened by another call: %w", s.id, proto.ErrBadRequest)
	case stateEnded:
		err := s.endErr
		s.mu.Unlock()
		return proto.SessionInfo{}, err
	}
	s.state = stateOpening
	s.mu.Unlock()

	info, err := s.start(ctx, a)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.state == stateEnded { // expired or closed while starting
		if s.worker != nil {
			s.worker.kill()
		}
		return proto.SessionInfo{}, s.endErr
	}
	if err != nil {
		// A session that could not open (no valid lease, a worker that
		// would not start) gives its slot back at once: the next client
		// must not find the device busy with a session that never was.
		s.mu.Unlock()
		s.end("open_failed", err)
		s.mu.Lock()
		return proto.SessionInfo{}, err
	}
	s.state = stateOpen
	s.info = info
	s.info.ExpiresAt = s.deadline.UnixNano()
	return s.info, nil
}

// start does the work of open.
func (s *session) start(ctx context.Context, a proto.OpenArgs) (proto.SessionInfo, error) {
	d := s.d
	if s.helloLease != "" {
		// A client admitted by its lease token opens the session of that
		// lease and no other.
		switch {
		case a.LeaseToken == "":
			a.LeaseToken = s.helloLease
		case !proto.TokenEqual(a.LeaseToken, s.helloLease):
			return proto.SessionInfo{}, fmt.Errorf("open session: the lease token differs from the one this connection was admitted with: %w", proto.ErrUnauthorized)
		}
	}
	if d.cfg.Tracker != nil {
		switch {
		case a.LeaseToken != "":
			li, err := d.cfg.Tracker.VerifyLease(ctx, a.LeaseToken)
			if err != nil {
				return proto.SessionInfo{}, fmt.Errorf("open session: lease not valid for this device: %w", err)
			}
			s.mu.Lock()
			s.user = li.User
			s.leaseToken = a.LeaseToken
			s.mu.Unlock()
			if err := d.take(s, li.ID); err != nil {
				s.mu.Lock()
				s.leaseToken = ""
				s.mu.Unlock()
				return proto.SessionInfo{}, fmt.Errorf("open session: %w", err)
			}
			d.m.users.Inc(li.User)
			d.m.usersActive.Add(1, li.User)
			// A lease may ask for a shorter session than the daemon
			// allows, never a longer one.
			if li.SessionTimeout > 0 && li.SessionTimeout < d.cfg.SessionTimeout {
				s.armDeadline(li.SessionTimeout)
			}
			d.cfg.Tracker.SetActiveLeases(d.activeLeases())
		case !d.cfg.AllowWithoutLease:
			return proto.SessionInfo{}, fmt.Errorf("open session: this device serves clients with a tracker lease only; request one from the tracker: %w", proto.ErrUnauthorized)
		default:
			if err := d.take(s, ""); err != nil {
				return proto.SessionInfo{}, fmt.Errorf("open session: %w", err)
			}
		}
	} else if err := d.take(s, ""); err != nil {
		return proto.SessionInfo{}, fmt.Errorf("open session: %w", err)
	}
	if a.Timeout > 0 {
		s.mu.Lock()
		longer := a.Timeout < s.timeout
		s.mu.Unlock()
		if longer {
			s.armDeadline(a.Timeout)
		}
	}
	dir, err := os.MkdirTemp(d.cfg.Dir, "session-"+s.id+"-")
	if err != nil {
		return proto.SessionInfo{}, fmt.Errorf("open session: %w", err)
	}
	for _, sub := range []string{"files", "modules"} {
		if err := os.Mkdir(filepath.Join(dir, sub), 0o700); err != nil {
			os.RemoveAll(dir)
			return proto.SessionInfo{}, fmt.Errorf("open session: %w", err)
		}
	}
	box, err := openSandbox(filepath.Join(dir, "files"), d.cfg.SessionQuota)
	if err != nil {
		os.RemoveAll(dir)
		return proto.SessionInfo{}, fmt.Errorf("open session: %w", err)
	}
	box.counted = dir
	jail, err := s.confine(dir)
	if err != nil {
		box.Close()
		os.RemoveAll(dir)
		return proto.SessionInfo{}, fmt.Errorf("open session: %w", err)
	}
	spec := d.cfg.Worker
	spec.plugins = d.plugins
	if d.cfg.MaxFrameSize > 0 {
		spec.Env = append(slices.Clone(spec.Env), EnvWorkerMaxFrame+"="+strconv.Itoa(d.cfg.MaxFrameSize))
	}
	if s.gpu >= 0 {
		// On a board of several GPUs each session has one: its worker
		// sees that one alone, as cuda:0.
		spec.Env = append(slices.Clone(spec.Env), "CUDA_VISIBLE_DEVICES="+d.gpus[s.gpu])
		s.log.Info("session gets a GPU of its own", "cuda_visible_devices", d.gpus[s.gpu])
	}
	w, err := spawnWorker(ctx, spec, d.iso, jail, s.id, dir, d.cfg.SessionQuota, s.log, &d.wg, s.workerExited)
	if err != nil {
		s.unconfine()
		box.Close()
		os.RemoveAll(dir)
		return proto.SessionInfo{}, fmt.Errorf("open session: %w", err)
	}
	s.mu.Lock()
	if s.closed { // the client left while the worker started: close() has run
		s.mu.Unlock()
		w.stop(time.Second)
		box.Close()
		os.RemoveAll(dir)
		return proto.SessionInfo{}, fmt.Errorf("open session: the connection closed: %w", proto.ErrUnavailable)
	}
	s.dir, s.box, s.worker = dir, box, w
	box.worker.Store(int64(w.pid()))
	// Calls go straight to the worker on a connection of their own,
	// unless TLS keeps them here: the encryption state of a TLS
	// connection cannot leave the daemon's process.
	var ticket string
	if d.cfg.TLS == nil && w.board != nil {
		ticket = d.issueCallTicket(s)
		s.callTicket = ticket
	}
	s.mu.Unlock()
	d.postPeers()
	s.log.Info("session open", "worker", w.pid(), "dir", dir, "direct_calls", ticket != "")
	return proto.SessionInfo{ID: s.id, Key: d.cfg.Key, WorkerPID: w.pid(), Version: d.cfg.Version, CallTicket: ticket}, nil
}

// end marks the session ended with err (the first end wins), gives the
// device slot back and arranges for the connection to close after
// endGrace. It returns false when the session had already ended.
func (s *session) end(how string, err error) bool {
	s.mu.Lock()
	if s.state == stateEnded {
		s.mu.Unlock()
		return false
	}
	s.state, s.endErr, s.endHow = stateEnded, err, how
	if s.expiry != nil {
		s.expiry.Stop()
	}
	if s.opener != nil {
		s.opener.Stop()
	}
	if !s.closed {
		s.closer = time.AfterFunc(endGrace, func() { s.c.Close() })
	}
	lease, ticket, leased, user := s.lease, s.callTicket, s.leaseToken != "", s.user
	s.mu.Unlock()
	if leased {
		s.d.m.usersActive.Add(-1, user)
	}
	s.d.dropCallTicket(ticket)
	s.d.m.ended.Inc(how)
	s.d.release(s)
	if lease != "" && s.d.cfg.Tracker != nil {
		s.d.cfg.Tracker.SetActiveLeases(s.d.activeLeases())
	}
	return true
}

// expire ends a session that passed its deadline: its worker is killed.
func (s *session) expire() {
	s.mu.Lock()
	timeout, w := s.timeout, s.worker
	s.mu.Unlock()
	err := fmt.Errorf("session %s expired: it passed its deadline (session timeout %s); open a new session: %w", s.id, timeout, proto.ErrSessionExpired)
	if !s.end("expired", err) {
		return
	}
	s.log.Warn("session expired: stopping its worker", "timeout", timeout)
	if w != nil {
		w.kill()
	}
}

// leaseGone ends a session whose lease the tracker says was released or
// expired: its worker is killed.
func (s *session) leaseGone() {
	s.mu.Lock()
	lease, w := s.lease, s.worker
	s.mu.Unlock()
	err := fmt.Errorf("session %s has ended: its lease %s was released or expired; ask the tracker for a new lease: %w", s.id, lease, proto.ErrSessionExpired)
	if !s.end("lease_ended", err) {
		return
	}
	s.log.Warn("lease ended: stopping the session's worker", "lease", lease)
	if w != nil {
		w.kill()
	}
}

// workerExited runs when the worker process has ended. Unless the session
// had already ended, the worker crashed: the session ends with ErrCrashed,
// naming the signal and the calls that were running.
func (s *session) workerExited() {
	s.mu.Lock()
	w := s.worker
	calls := make([]inflightCall, 0, len(s.inflight))
	for _, c := range s.inflight {
		calls = append(calls, c)
	}
	s.mu.Unlock()
	running := make([]string, 0, len(calls))
	for _, c := range calls {
		running = append(running, s.describe(c.method, c.args))
	}
	if w == nil {
		return // it died while starting; open reports that
	}
	// The call board says what the worker was doing, calls that came on
	// the client's call connection included (the daemon never saw those).
	var overran []string
	for _, c := range w.board.calls() {
		if c.overran {
			overran = append(overran, c.text)
		}
		if !slices.Contains(running, c.text) {
			running = append(running, c.text)
		}
		if c.direct {
			s.d.m.calls.Inc(c.method, string(proto.CodeCrashed))
		}
	}
	s.syncCounts(w)
	if len(overran) > 0 {
		sort.Strings(overran)
		err := fmt.Errorf("%s ran past the call's deadline: its worker (process %d) was killed and session %s has ended, so the device is free; open a new session to go on: %w",
			strings.Join(overran, ", "), w.pid(), s.id, proto.ErrDeadline)
		if s.end("call_deadline", err) {
			s.log.Warn("call past its deadline: worker killed", "call", strings.Join(overran, ", "))
		}
		return
	}
	reason, crashed := w.reason()
	if s.d.iso.oomKilled(s.id) {
		reason = fmt.Sprintf("%s: the session ran out of memory (its cap is %d bytes, the daemon's --max-session-memory)", reason, s.d.iso.memory)
	}
	sort.Strings(running)
	during := "while idle"
	if len(running) > 0 {
		during = "while running " + strings.Join(running, ", ")
	}
	err := fmt.Errorf("worker process %d crashed: %s %s; session %s has ended (loaded modules and arrays are gone), open a new one: %w",
		w.pid(), reason, during, s.id, proto.ErrCrashed)
	if !crashed {
		err = fmt.Errorf("worker process %d %s %s; session %s has ended: %w", w.pid(), reason, during, s.id, proto.ErrCrashed)
	}
	if !s.end("crashed", err) {
		return
	}
	s.d.m.crashes.Inc()
	s.log.Error("worker crashed", "reason", reason, "during", during, "last_output", lastLines(w.stderr.Lines(), 8))
	if fr, ok := s.d.cfg.Tracker.(FailureReporter); ok {
		s.d.wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := fr.ReportFailure(ctx, err.Error()); err != nil {
				s.log.Warn("report failure to tracker", "err", err)
			}
		})
	}
}

// close ends the session when its client asks (proto.SessionClose) or its
// connection has ended, whichever comes first: it frees the device's slot,
// stops the worker and removes the session directory.
func (s *session) close() {
	s.mu.Lock()
	if s.closed { // the client's session.close ran it, or is running it
		s.mu.Unlock()
		return
	}
	s.closed = true
	if s.closer != nil {
		s.closer.Stop()
	}
	s.mu.Unlock()
	s.end("closed", fmt.Errorf("session %s is closed: %w", s.id, proto.ErrUnavailable))
	s.mu.Lock()
	w, box, dir := s.worker, s.box, s.dir
	s.mu.Unlock()
	if w != nil {
		w.stop(5 * time.Second)
		s.syncCounts(w)
		w.board.unmap()
		s.unconfine()
	}
	if box != nil {
		box.Close()
	}
	if dir != "" {
		if err := os.RemoveAll(dir); err != nil {
			s.log.Warn("remove session directory", "dir", dir, "err", err)
		}
	}
	s.log.Info("session closed", "how", s.endHow, "lasted", time.Since(s.started).Round(time.Millisecond))
}

// inflightCall is a request forwarded to the worker and not yet answered;
// describe names it when a crash report needs it.
type inflightCall struct {
	method string
	args   msgpack.RawMessage
}

// track records a call in flight for crash reports; untrack forgets it.
// Describing the call is left to the crash report.
func (s *session) track(what inflightCall) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.nextCall++
	s.inflight[s.nextCall] = what
	return s.nextCall
}

func (s *session) untrack(id uint64) {
	s.mu.Lock()
	delete(s.inflight, id)
	s.mu.Unlock()
}

// describe says what a forwarded request does, naming the function of a
// call.
func (s *session) describe(method string, args msgpack.RawMessage) string {
	switch method {
	case proto.FuncCall, proto.FuncTime:
		var a struct {
			Func uint64 `msgpack:"func"`
		}
		if msgpack.Unmarshal(args, &a) == nil {
			s.mu.Lock()
			name, ok := s.funcNames[a.Func]
			s.mu.Unlock()
			if ok {
				return fmt.Sprintf("function %q (%s)", name, method)
			}
			return fmt.Sprintf("function handle %d (%s)", a.Func, method)
		}
	case proto.ModuleLoad:
		var a proto.ModuleLoadArgs
		if msgpack.Unmarshal(args, &a) == nil {
			return fmt.Sprintf("%s of %q", method, a.Name)
		}
	}
	return method
}

// failed explains a worker call that failed: when the worker connection
// broke, it waits for the worker's exit and returns why the session ended.
func (s *session) failed(ctx context.Context, w *workerProc, err error) error {
	var we *proto.WireError
	if !errors.Is(err, proto.ErrUnavailable) {
		if errors.As(err, &we) {
			return we
		}
		return err
	}
	select {
	case <-w.exited:
	case <-ctx.Done():
	case <-time.After(10 * time.Second):
		s.log.Error("worker connection broke but the worker lives: killing it", "err", err)
		w.kill()
		<-w.exited
	}
	s.mu.Lock()
	endErr := s.endErr
	s.mu.Unlock()
	if endErr != nil {
		return endErr
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}

// overran ends the session of a call or timing that ran past its
// deadline: the kernel cannot be interrupted, so its worker is killed and
// the device freed instead of staying busy until the session's deadline.
func (s *session) overran(w *workerProc, method string, args msgpack.RawMessage) error {
	err := fmt.Errorf("%s ran past the call's deadline: its worker (process %d) was killed and session %s has ended, so the device is free; open a new session to go on: %w",
		s.describe(method, args), w.pid(), s.id, proto.ErrDeadline)
	if s.end("call_deadline", err) {
		s.log.Warn("call past its deadline: worker killed", "call", s.describe(method, args))
		w.kill()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.endErr
}

// forward runs a method on the worker with the client's raw arguments.
func (s *session) forward(ctx context.Context, method string, args msgpack.RawMessage) (any, error) {
	w, err := s.live()
	if err != nil {
		return nil, err
	}
	id := s.track(inflightCall{method: method, args: args})
	defer s.untrack(id)
	var raw msgpack.RawMessage
	if err := w.calls.Call(ctx, method, args, &raw); err != nil {
		if (method == proto.FuncCall || method == proto.FuncTime) && errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return nil, s.overran(w, method, args)
		}
		return nil, s.failed(ctx, w, err)
	}
	if method == proto.ModuleGetFunction || method == proto.GlobalGet {
		var fi proto.FuncInfo
		if msgpack.Unmarshal(raw, &fi) == nil {
			s.mu.Lock()
			s.funcNames[fi.Handle] = fi.Name
			s.mu.Unlock()
		}
	}
	return raw, nil
}

// forwardUpload streams a bulk upload through to the worker.
func (s *session) forwardUpload(ctx context.Context, method string, in proto.Bulk) (proto.Bulk, error) {
	w, err := s.live()
	if err != nil {
		return proto.Bulk{}, err
	}
	id := s.track(inflightCall{method: method})
	defer s.untrack(id)
	if _, err := w.client.Bulk(ctx, method, in, nil); err != nil {
		return proto.Bulk{}, s.failed(ctx, w, err)
	}
	s.d.m.bulkByte.Add(float64(in.Size), method)
	return proto.Bulk{}, nil
}

// forwardDownload streams a bulk download from the worker to the client:
// it asks the worker for the size, then pipes the worker's bytes through
// while proto sends them.
func (s *session) forwardDownload(ctx context.Context, c *proto.Conn, method string, in proto.Bulk) (proto.Bulk, error) {
	w, err := s.live()
	if err != nil {
		return proto.Bulk{}, err
	}
	var size int64
	if err := w.calls.Call(ctx, proto.WorkerBulkSize, proto.BulkSizeArgs{Method: method, Name: in.Name}, &size); err != nil {
		return proto.Bulk{}, s.failed(ctx, w, err)
	}
	// The transfer outlives the handler (proto sends the body after it
	// returns), so it runs under the connection's context and the
	// request's deadline, not the handler's context.
	bctx, cancel := context.WithCancel(c.Context())
	if dl, ok := ctx.Deadline(); ok {
		bctx, cancel = context.WithDeadline(c.Context(), dl)
	}
	pr, pw := io.Pipe()
	stop := context.AfterFunc(bctx, func() { pr.CloseWithError(bctx.Err()) })
	done := make(chan struct{})
	s.d.wg.Go(func() {
		defer close(done)
		_, err := w.client.Bulk(bctx, method, proto.Bulk{Name: in.Name}, pw)
		if err != nil {
			err = s.failed(bctx, w, err)
		}
		pw.CloseWithError(err)
	})
	return proto.Bulk{Name: in.Name, Size: size, Body: &pipeBody{PipeReader: pr, done: done, stop: stop, cancel: cancel}}, nil
}

// pipeBody is a download body fed by a goroutine; Close ends the goroutine
// and waits for it.
type pipeBody struct {
	*io.PipeReader
	done   chan struct{}
	stop   func() bool
	cancel context.CancelFunc
	once   sync.Once
}

func (p *pipeBody) Close() error {
	p.once.Do(func() {
		p.PipeReader.Close()
		p.cancel()
		<-p.done
		p.stop()
	})
	return nil
}

// inFlight counts the session's requests running in its worker: those on
// the call board (which the daemon's forwarded ones are on too), else
// those the daemon forwarded.
func (s *session) inFlight() int {
	s.mu.Lock()
	w, n, ended := s.worker, len(s.inflight), s.state == stateEnded
	s.mu.Unlock()
	if w != nil && w.board != nil {
		if ended {
			return 0
		}
		return len(w.board.calls())
	}
	return n
}

// syncCounts adds the calls the worker served on the client's call
// connection since the last sync to the daemon's calls_total.
func (s *session) syncCounts(w *workerProc) {
	if w == nil || w.board == nil {
		return
	}
	now := w.board.counts()
	s.mu.Lock()
	defer s.mu.Unlock()
	for m := range len(boardMethodNames) {
		for c := range len(boardCodeNames) {
			if now[m][c] > s.counted[m][c] {
				s.d.m.calls.Add(float64(now[m][c]-s.counted[m][c]), boardMethodNames[m], string(boardCodeNames[c]))
				s.counted[m][c] = now[m][c]
			}
		}
	}
}

// status answers proto.SessionStatus: nil while the session is open, else
// why it ended. A client asks when its call connection broke, which the
// worker's death does: the answer waits a moment for the daemon to see it.
func (s *session) status(ctx context.Context) error {
	s.mu.Lock()
	state, w := s.state, s.worker
	s.mu.Unlock()
	if state == stateOpen && w != nil {
		t := time.NewTimer(5 * time.Second)
		defer t.Stop()
		select {
		case <-w.exited:
		case <-t.C:
		case <-ctx.Done():
		}
	}
	_, err := s.live()
	return err
}

// confine takes a worker uid and makes the cgroups for the session whose
// directory is dir; the directory becomes the uid's.
func (s *session) confine(dir string) (jailing, error) {
	iso := s.d.iso
	uid, err := iso.takeUIDWait(uidWait)
	if err != nil {
		return jailing{}, fmt.Errorf("%v: %w", err, proto.ErrBusy)
	}
	if uid > 0 {
		for _, p := range []string{dir, filepath.Join(dir, "files"), filepath.Join(dir, "modules")} {
			if err := os.Chown(p, uid, uid); err != nil {
				iso.giveUID(uid)
				return jailing{}, fmt.Errorf("give the session directory to worker uid %d: %w", uid, err)
			}
		}
	}
	cg, err := iso.sessionCgroups(s.id)
	if err != nil {
		iso.giveUID(uid)
		return jailing{}, err
	}
	j := jailing{uid: uid, cgroups: cg}
	s.mu.Lock()
	s.jail, s.confined = j, true
	s.mu.Unlock()
	return j, nil
}

// unconfine gives the session's uid and cgroups back once its processes
// are gone (idempotent).
func (s *session) unconfine() {
	s.mu.Lock()
	j, ok := s.jail, s.confined
	s.confined = false
	s.mu.Unlock()
	if !ok {
		return
	}
	s.d.iso.removeCgroups(s.id)
	s.d.iso.giveUID(j.uid)
}
