package client

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode"

	"github.com/kiln-ml/kiln/rpcserver/proto"
)

// Registrar keeps a device daemon or compiler node registered with a
// tracker: it dials, registers, sends heartbeats, registers again when the
// tracker answers a heartbeat with not_found (it restarted) and, when the
// connection drops or the tracker answers unavailable, dials the next
// reachable tracker replica (with jittered backoff) and registers there.
// Run drives it until its context ends. The methods a daemon or compiler
// node needs (VerifyLease, Report, TakeJob, …) run on its current
// connection; between connections they wait for the next one, and one whose
// connection fails is made again on the next (up to the failover time).
type Registrar struct {
	// OnHealthCheck, when set, runs when the tracker asks a quarantined
	// device for a health check; its result is reported. Set it before Run.
	OnHealthCheck func(ctx context.Context) error

	addrs *trackerAddrs
	opts  TrackerOptions
	role  proto.Role
	log   *slog.Logger

	mu          sync.Mutex
	args        proto.RegisterArgs
	c           *proto.Client
	changed     chan struct{} // closed and replaced when c changes
	interval    time.Duration
	activeLease []string
	unleased    int // sessions served under no lease
	load        string
	state       proto.NodeState

	onLeaseEnded func(id string)
	saved        string // the node id in NodeIDFile

	ready     chan struct{}
	readyOnce sync.Once
	kick      chan struct{}
}

// NewRegistrar returns a Registrar for args (Role device or compiler). An
// empty args.NodeID is chosen by the tracker at the first registration and
// kept afterwards. addrs is one HOST:PORT or several separated by commas
// (tracker replicas); a name may resolve to several addresses. A list that
// does not parse makes Run fail.
func NewRegistrar(addrs string, opts TrackerOptions, args proto.RegisterArgs) *Registrar {
	role := proto.RoleDevice
	if args.Role == proto.NodeCompiler {
		role = proto.RoleCompiler
	}
	r := &Registrar{
		addrs: newTrackerAddrs(addrs), opts: opts, role: role, log: opts.logger(),
		args: args, ready: make(chan struct{}), kick: make(chan struct{}, 1), changed: make(chan struct{}),
	}
	if args.NodeID == "" && opts.NodeIDFile != "" && opts.CredentialFile == "" {
		r.args.NodeID = r.savedNodeID()
		r.saved = r.args.NodeID
	}
	return r
}

// savedNodeID reads the node id a previous run kept in NodeIDFile ("" when
// there is none, or it does not hold an id).
func (r *Registrar) savedNodeID() string {
	b, err := os.ReadFile(r.opts.NodeIDFile)
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			r.log.Warn("node id file unreadable; the tracker chooses a new id", "file", r.opts.NodeIDFile, "err", err)
		}
		return ""
	}
	id := strings.TrimSpace(string(b))
	if id == "" || len(id) > 128 || strings.ContainsFunc(id, unicode.IsSpace) {
		r.log.Warn("node id file holds no node id; the tracker chooses a new id", "file", r.opts.NodeIDFile)
		return ""
	}
	return id
}

// Ready is closed once the first registration succeeded and the methods
// below have a connection to use.
func (r *Registrar) Ready() <-chan struct{} { return r.ready }

// NodeID returns the node's id ("" before the first registration when the
// tracker chooses it).
func (r *Registrar) NodeID() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.args.NodeID
}

// State returns the node's state from the last heartbeat reply.
func (r *Registrar) State() proto.NodeState {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.state
}

// SetActiveLease records the lease of the session the daemon serves ("" when
// idle) and sends a heartbeat at once, so the tracker learns of it.
func (r *Registrar) SetActiveLease(id string) {
	var ids []string
	if id != "" {
		ids = []string{id}
	}
	r.SetActiveLeases(ids)
}

// SetActiveLeases records the leases of every session the daemon serves
// (none when idle) and sends a heartbeat at once, so the tracker learns of
// them.
func (r *Registrar) SetActiveLeases(ids []string) {
	ids = slices.Clone(ids)
	r.mu.Lock()
	r.activeLease = ids
	r.args.ActiveLease, r.args.ActiveLeases = firstOf(ids), ids
	r.mu.Unlock()
	r.Kick()
}

// SetUnleasedSessions records how many sessions the daemon serves under
// no lease and sends a heartbeat at once: the tracker counts them against
// the device's capacity.
func (r *Registrar) SetUnleasedSessions(n int) {
	r.mu.Lock()
	r.unleased = n
	r.mu.Unlock()
	r.Kick()
}

func firstOf(ids []string) string {
	if len(ids) == 0 {
		return ""
	}
	return ids[0]
}

// WatchLeases has fn called with an active lease's id when a heartbeat
// reply says that lease was released or expired.
func (r *Registrar) WatchLeases(fn func(id string)) {
	r.mu.Lock()
	r.onLeaseEnded = fn
	r.mu.Unlock()
}

// SetLoad sets the free-form load text sent with heartbeats.
func (r *Registrar) SetLoad(load string) {
	r.mu.Lock()
	r.load = load
	r.mu.Unlock()
}

// Kick sends a heartbeat now.
func (r *Registrar) Kick() {
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// Run keeps the node registered until ctx ends, then deregisters (best
// effort) and returns nil. It returns an error only for a registration the
// tracker refuses outright (a wrong token, bad arguments).
func (r *Registrar) Run(ctx context.Context) error {
	b := newBackoff()
	for {
		registered, err := r.session(ctx)
		if ctx.Err() != nil {
			return nil
		}
		var fatal fatalError
		if errors.As(err, &fatal) || errors.Is(err, proto.ErrUnauthorized) || errors.Is(err, proto.ErrBadRequest) || errors.Is(err, proto.ErrVersion) {
			if r.usesCredential() && !errors.As(err, &fatal) {
				err = fmt.Errorf("%w (the node credential in %s was refused; if it was revoked, remove that file and start again with a new join token)", err, r.opts.CredentialFile)
			}
			return fmt.Errorf("tracker registration: %w", err)
		}
		if registered {
			b.reset()
		}
		r.log.Warn("tracker connection lost; connecting to the next reachable tracker", "err", err)
		if !b.wait(ctx) {
			return nil
		}
	}
}

// session runs one connection: dial, register, heartbeat until it fails
// or ctx ends. registered says whether registration got through.
func (r *Registrar) session(ctx context.Context) (registered bool, err error) {
	opts := r.opts
	if opts.Token, err = r.token(ctx); err != nil {
		return false, err
	}
	c, addr, err := opts.dialAny(ctx, r.addrs, r.role)
	if err != nil {
		return false, err
	}
	defer c.Close()
	// A replica that fails this connection (or answers unavailable) is
	// the last one tried at the next dial.
	defer func() {
		if err != nil && ctx.Err() == nil {
			r.addrs.markFailed(addr)
		}
	}()
	if err := r.register(ctx, c); err != nil {
		return false, err
	}
	r.log.Info("registered with tracker", "tracker", addr, "node", r.NodeID())
	r.setConn(c)
	r.readyOnce.Do(func() { close(r.ready) })
	defer r.setConn(nil)
	for {
		r.mu.Lock()
		interval := r.interval
		r.mu.Unlock()
		timer := time.NewTimer(interval)
		select {
		case <-ctx.Done():
			timer.Stop()
			dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
			c.Call(dctx, proto.MethodTrackerDeregister, proto.DeregisterArgs{NodeID: r.NodeID()}, nil)
			cancel()
			return true, ctx.Err()
		case <-c.Done():
			timer.Stop()
			return true, c.Err()
		case <-r.kick:
			timer.Stop()
		case <-timer.C:
		}
		if err := r.heartbeat(ctx, c); err != nil {
			if ctx.Err() != nil {
				continue
			}
			if !errors.Is(err, proto.ErrNotFound) {
				return true, err
			}
			r.log.Info("tracker forgot this node; registering again", "node", r.NodeID())
			if err := r.register(ctx, c); err != nil {
				return true, err
			}
		}
	}
}

func (r *Registrar) register(ctx context.Context, c *proto.Client) error {
	r.mu.Lock()
	args := r.args
	r.mu.Unlock()
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var rep proto.RegisterReply
	if err := c.Call(cctx, proto.MethodTrackerRegister, args, &rep); err != nil {
		return fmt.Errorf("register with tracker: %w", err)
	}
	r.mu.Lock()
	r.args.NodeID = rep.NodeID
	r.interval = max(rep.HeartbeatInterval, 10*time.Millisecond)
	save := r.opts.NodeIDFile != "" && r.opts.CredentialFile == "" && rep.NodeID != r.saved
	r.mu.Unlock()
	if save {
		if err := writeFileAtomic(r.opts.NodeIDFile, []byte(rep.NodeID+"\n"), "node id file"); err != nil {
			r.log.Warn("node id not kept: a restart registers under a new one", "err", err)
		} else {
			r.mu.Lock()
			r.saved = rep.NodeID
			r.mu.Unlock()
		}
	}
	r.log.Debug("registered with tracker", "node", rep.NodeID, "addr", rep.Addr, "heartbeat", rep.HeartbeatInterval)
	return nil
}

func (r *Registrar) heartbeat(ctx context.Context, c *proto.Client) error {
	r.mu.Lock()
	args := proto.HeartbeatArgs{NodeID: r.args.NodeID, ActiveLease: firstOf(r.activeLease), ActiveLeases: r.activeLease, UnleasedSessions: r.unleased, Load: r.load}
	timeout := max(r.interval, time.Second)
	r.mu.Unlock()
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var rep proto.HeartbeatReply
	if err := c.Call(cctx, proto.MethodTrackerHeartbeat, args, &rep); err != nil {
		return err
	}
	r.mu.Lock()
	r.state = rep.State
	if rep.HeartbeatInterval > 0 {
		r.interval = rep.HeartbeatInterval
	}
	onEnded := r.onLeaseEnded
	r.mu.Unlock()
	if onEnded != nil {
		switch {
		case len(rep.EndedLeases) > 0:
			for _, id := range rep.EndedLeases {
				if slices.Contains(args.ActiveLeases, id) {
					onEnded(id)
				}
			}
		case rep.LeaseEnded && args.ActiveLease != "":
			onEnded(args.ActiveLease)
		}
	}
	if rep.HealthCheck && r.OnHealthCheck != nil {
		herr := r.OnHealthCheck(ctx)
		rep := proto.ReportArgs{NodeID: args.NodeID, Kind: proto.ReportHealth, OK: herr == nil}
		if herr != nil {
			rep.Message = herr.Error()
		}
		if err := c.Call(cctx, proto.MethodTrackerReport, rep, nil); err != nil {
			r.log.Warn("report health check", "err", err)
		}
	}
	return nil
}

// setConn makes c (registered) the connection the methods use; nil while
// between connections.
func (r *Registrar) setConn(c *proto.Client) {
	r.mu.Lock()
	r.c = c
	close(r.changed)
	r.changed = make(chan struct{})
	r.mu.Unlock()
}

// conn returns the current connection or an error wrapping ErrUnavailable.
func (r *Registrar) conn() (*proto.Client, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.c == nil || r.c.Err() != nil {
		return nil, fmt.Errorf("not connected to tracker %s: %w", r.addrs, proto.ErrUnavailable)
	}
	return r.c, nil
}

// await returns the current connection, waiting for one while the node
// is between connections until ctx ends or the failover time since since
// is spent.
func (r *Registrar) await(ctx context.Context, since time.Time) (*proto.Client, error) {
	for {
		c, err := r.conn()
		if err == nil {
			return c, nil
		}
		r.mu.Lock()
		changed := r.changed
		r.mu.Unlock()
		left := r.opts.failoverTimeout() - time.Since(since)
		if left <= 0 {
			return nil, err
		}
		t := time.NewTimer(left)
		select {
		case <-changed:
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("waiting for a tracker connection: %w", proto.ErrUnavailable)
		}
		t.Stop()
	}
}

// do runs fn on the current connection and again on the next while it
// fails with a retryable error, up to the failover time. A connection fn
// failed on is closed, so that Run moves to the next replica.
func (r *Registrar) do(ctx context.Context, fn func(c *proto.Client, try int) error) error {
	get := func(since time.Time) (*proto.Client, error) { return r.await(ctx, since) }
	lost := func(c *proto.Client, _ error) { c.Close() }
	return retryOn(ctx, r.opts.failoverTimeout(), get, lost, fn)
}

func (r *Registrar) call(ctx context.Context, method string, args, result any) error {
	return r.do(ctx, func(c *proto.Client, _ int) error { return c.Call(ctx, method, args, result) })
}

// VerifyLease asks the tracker whether token is a live lease on this
// device: it fails with an error wrapping proto.ErrNotFound (unknown
// token), proto.ErrSessionExpired (expired) or proto.ErrBadRequest (a lease
// on another device).
func (r *Registrar) VerifyLease(ctx context.Context, token string) (proto.LeaseInfo, error) {
	var info proto.LeaseInfo
	err := r.call(ctx, proto.MethodLeaseVerify, proto.LeaseVerifyArgs{NodeID: r.NodeID(), Token: token}, &info)
	if err != nil {
		return info, fmt.Errorf("verify lease: %w", err)
	}
	return info, nil
}

// ReportFailure reports a failure of this device (a crashed worker).
func (r *Registrar) ReportFailure(ctx context.Context, message string) error {
	args := proto.ReportArgs{NodeID: r.NodeID(), Kind: proto.ReportFailure, Message: message}
	if err := r.call(ctx, proto.MethodTrackerReport, args, nil); err != nil {
		return fmt.Errorf("report device failure: %w", err)
	}
	return nil
}

// TakeJob waits up to wait for a build job matching this compiler node's
// targets; it returns nil, nil when none came.
func (r *Registrar) TakeJob(ctx context.Context, wait time.Duration) (*proto.BuildJob, error) {
	var rep proto.BuildTakeReply
	if err := r.call(ctx, proto.MethodBuildTake, proto.BuildTakeArgs{NodeID: r.NodeID(), Wait: wait}, &rep); err != nil {
		return nil, fmt.Errorf("take build job: %w", err)
	}
	return rep.Job, nil
}

// JobProgress reports a running job's progress. An error wrapping
// proto.ErrCancelled means the job is no longer this node's: stop it.
func (r *Registrar) JobProgress(ctx context.Context, id string, fraction float64, message string) error {
	args := proto.BuildProgressArgs{ID: id, NodeID: r.NodeID(), Fraction: fraction, Message: message}
	if err := r.call(ctx, proto.MethodBuildProgress, args, nil); err != nil {
		return fmt.Errorf("report progress of build job %s: %w", id, err)
	}
	return nil
}

// UploadArtifact stores size bytes of body on the tracker under sha (their
// sha256); a body that is an io.Seeker is sent again when the connection
// fails.
func (r *Registrar) UploadArtifact(ctx context.Context, sha string, size int64, body io.Reader) error {
	return r.do(ctx, func(c *proto.Client, try int) error { return uploadArtifact(ctx, c, sha, size, body, try) })
}

// DownloadArtifact copies the artifact-store entry with the given sha256
// to w (the model of a build job that travelled through the store); it
// starts over through the next connection when nothing was written yet or
// w can start over.
func (r *Registrar) DownloadArtifact(ctx context.Context, sha string, w io.Writer) (int64, error) {
	return downloadVia(ctx, r.do, sha, w)
}

// FetchModule copies a build job's module to w when it was not handed out
// inline (job.Module empty, job.ModuleSize bytes): streamed from the
// tracker's module store, checked against job.ModuleSize and
// job.ModuleSHA256. Only the node running the job may read it.
func (r *Registrar) FetchModule(ctx context.Context, job *proto.BuildJob, w io.Writer) error {
	what := fmt.Sprintf("build job %s's module", job.ID)
	hw := &hashingWriter{w: w, h: sha256.New()}
	var n int64
	err := r.do(ctx, func(c *proto.Client, _ int) error {
		var err error
		n, err = downloadBulk(ctx, c, proto.BulkBuildModule, what, job.ID, hw, n)
		return err
	})
	switch {
	case err != nil:
		return err
	case n != job.ModuleSize:
		return fmt.Errorf("download %s: got %d bytes, the job says %d: %w", what, n, job.ModuleSize, proto.ErrInternal)
	}
	if got := hex.EncodeToString(hw.h.Sum(nil)); job.ModuleSHA256 != "" && got != job.ModuleSHA256 {
		return fmt.Errorf("download %s: the bytes hash to %s, the job says %s: %w", what, got, job.ModuleSHA256, proto.ErrInternal)
	}
	return nil
}

// hashingWriter hashes what it writes to w; it starts over (for a retry)
// where w can.
type hashingWriter struct {
	w io.Writer
	h hash.Hash
}

func (hw *hashingWriter) Write(p []byte) (int, error) {
	n, err := hw.w.Write(p)
	hw.h.Write(p[:n])
	return n, err
}

func (hw *hashingWriter) Seek(off int64, whence int) (int64, error) {
	rw, ok := hw.w.(rewindable)
	if !ok || off != 0 || whence != io.SeekStart {
		return 0, fmt.Errorf("the destination cannot start over: %w", errors.ErrUnsupported)
	}
	hw.h.Reset()
	return rw.Seek(0, io.SeekStart)
}

func (hw *hashingWriter) Truncate(size int64) error {
	rw, ok := hw.w.(rewindable)
	if !ok {
		return fmt.Errorf("the destination cannot start over: %w", errors.ErrUnsupported)
	}
	return rw.Truncate(size)
}

// CompleteJob marks a job succeeded with its (uploaded) artifact.
func (r *Registrar) CompleteJob(ctx context.Context, id, sha, log string) error {
	args := proto.BuildCompleteArgs{ID: id, NodeID: r.NodeID(), Artifact: sha, Log: log}
	if err := r.call(ctx, proto.MethodBuildComplete, args, nil); err != nil {
		return fmt.Errorf("complete build job %s: %w", id, err)
	}
	return nil
}

// FailJob marks a job failed with the compiler's message.
func (r *Registrar) FailJob(ctx context.Context, id, message, log string) error {
	args := proto.BuildFailArgs{ID: id, NodeID: r.NodeID(), Message: message, Log: log}
	if err := r.call(ctx, proto.MethodBuildFail, args, nil); err != nil {
		return fmt.Errorf("fail build job %s: %w", id, err)
	}
	return nil
}

// Connected returns nil while the node is registered with the tracker over
// a live connection, else an error naming the tracker (a readiness
// probe's answer).
func (r *Registrar) Connected() error {
	_, err := r.conn()
	return err
}
