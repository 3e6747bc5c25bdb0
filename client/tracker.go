package client

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/kiln-ml/kiln/rpcserver/proto"
)

// TrackerOptions configures DialTracker and NewRegistrar.
type TrackerOptions struct {
	// Token is the tracker's auth token. For a Registrar it may be a join
	// token (it starts with "kiln-join-"): the node then exchanges it once
	// for its own credential, kept in CredentialFile.
	Token string
	// CredentialFile is where a Registrar keeps the node credential a join
	// token was exchanged for; when it exists, its credential is used
	// instead of Token. Required with a join token.
	CredentialFile string
	// TLS, when set, dials over TLS (see proto.TLSConfig.Client).
	TLS *tls.Config
	// HandshakeTimeout bounds the dial and hello (proto's default when 0).
	HandshakeTimeout time.Duration
	// Logger receives debug logs (slog.Default() when nil).
	Logger *slog.Logger
}

func (o TrackerOptions) dial(ctx context.Context, addr string, role proto.Role) (*proto.Client, error) {
	return proto.Dial(ctx, addr, proto.DialOptions{
		Role: role, Token: o.Token, TLS: o.TLS, HandshakeTimeout: o.HandshakeTimeout, Logger: o.logger(),
	})
}

func (o TrackerOptions) logger() *slog.Logger {
	if o.Logger == nil {
		return slog.Default()
	}
	return o.Logger
}

// Tracker is a client's connection to a tracker. It is safe for
// concurrent use.
type Tracker struct {
	c   *proto.Client
	log *slog.Logger

	mu     sync.Mutex
	leases map[*Lease]struct{}
	closed bool
}

// DialTracker connects to the tracker at addr as a client.
func DialTracker(ctx context.Context, addr string, opts TrackerOptions) (*Tracker, error) {
	c, err := opts.dial(ctx, addr, proto.RoleClient)
	if err != nil {
		return nil, fmt.Errorf("connect to tracker: %w", err)
	}
	return &Tracker{c: c, log: opts.logger(), leases: make(map[*Lease]struct{})}, nil
}

// Close stops the renewal of every lease still held (they expire on the
// tracker at their TTL) and closes the connection. It is idempotent.
func (t *Tracker) Close() error {
	t.mu.Lock()
	t.closed = true
	leases := make([]*Lease, 0, len(t.leases))
	for l := range t.leases {
		leases = append(leases, l)
	}
	t.mu.Unlock()
	for _, l := range leases {
		l.stopRenewing()
	}
	return t.c.Close()
}

// Query returns the tracker's summary: devices by key and state, compiler
// nodes, queues with their waiting requests, recent jobs (up to jobs; 0
// for the tracker's default).
func (t *Tracker) Query(ctx context.Context, jobs int) (proto.TrackerSummary, error) {
	return t.QueryPage(ctx, proto.QueryArgs{Jobs: jobs})
}

// QueryPage is Query with a page of jobs: a.Jobs of those submitted before
// a.JobsBefore (the previous page's MoreJobsBefore).
func (t *Tracker) QueryPage(ctx context.Context, a proto.QueryArgs) (proto.TrackerSummary, error) {
	var sum proto.TrackerSummary
	if err := t.c.Call(ctx, proto.MethodTrackerQuery, a, &sum); err != nil {
		return sum, fmt.Errorf("query tracker: %w", err)
	}
	return sum, nil
}

// LeaseRequest says which device a client wants.
type LeaseRequest struct {
	// Key asks for a device registered under it; empty means any key.
	Key string
	// Selector filters by attributes, "cuda.compute>=8.0,cpu.avx512=true".
	Selector string
	// Priority orders waiting requests: higher first, FIFO within one.
	Priority int
	// SessionTimeout is passed to the daemon (0: its default).
	SessionTimeout time.Duration
	// TTL is the lease's life between renewals (0: the tracker's default).
	TTL time.Duration
	// User names the requester in the tracker's query output.
	User string
	// OnPosition, when set, is called with the request's queue position
	// (1 = next) and queue name whenever it changes while waiting.
	OnPosition func(position int, queue string)
	// NoRenew turns off the Lease's automatic renewal.
	NoRenew bool
}

// Lease is a granted lease. Unless NoRenew was set it renews itself at a
// third of its TTL until Release (or the Tracker's Close).
type Lease struct {
	proto.Lease
	t *Tracker

	mu      sync.Mutex
	expires time.Time
	err     error // why renewal stopped
	stop    chan struct{}
	stopped bool
	wg      sync.WaitGroup
}

// RequestLease asks for a device and waits, queued, until one is granted or
// ctx ends. When ctx's deadline passes first the error wraps
// proto.ErrDeadline and says how long it waited, at which queue position,
// and whether any device serves the request at all.
func (t *Tracker) RequestLease(ctx context.Context, req LeaseRequest) (*Lease, error) {
	args := proto.LeaseRequestArgs{
		Key: req.Key, Selector: req.Selector, Priority: req.Priority,
		SessionTimeout: req.SessionTimeout, TTL: req.TTL, User: req.User,
	}
	if d, ok := ctx.Deadline(); ok {
		args.Deadline = d
	}
	what := describeRequest(req)
	start := time.Now()
	// Calls may outlive ctx's deadline by a moment: the tracker answers a
	// request that reaches its deadline with an error that says where it
	// stood in the queue and why, and that answer should arrive. A
	// cancelled ctx still cuts them at once.
	callCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	if d, ok := ctx.Deadline(); ok {
		var cancelD context.CancelFunc
		callCtx, cancelD = context.WithDeadline(callCtx, d.Add(time.Second))
		defer cancelD()
	}
	stop := context.AfterFunc(ctx, func() {
		if errors.Is(ctx.Err(), context.Canceled) {
			cancel()
		}
	})
	defer stop()
	var tk proto.LeaseTicket
	err := t.c.Call(callCtx, proto.MethodLeaseRequest, args, &tk)
	lastPos := -1
	for {
		if err == nil && tk.Lease == nil && ctx.Err() != nil {
			return nil, t.abandon(ctx, what, tk, start)
		}
		if err != nil {
			if errors.Is(err, proto.ErrDeadline) {
				return nil, fmt.Errorf("request lease: %w", err)
			}
			if ctx.Err() != nil {
				return nil, t.abandon(ctx, what, tk, start)
			}
			return nil, fmt.Errorf("request lease for %s: %w", what, err)
		}
		if tk.Lease != nil {
			return t.newLease(*tk.Lease, req.NoRenew), nil
		}
		if tk.Position != lastPos && req.OnPosition != nil {
			req.OnPosition(tk.Position, tk.Queue)
		}
		lastPos = tk.Position
		ticket, served := tk.Ticket, tk.Served
		tk = proto.LeaseTicket{}
		err = t.c.Call(callCtx, proto.MethodLeaseWait, proto.LeaseWaitArgs{Ticket: ticket}, &tk)
		if tk.Ticket == "" {
			tk.Ticket, tk.Position, tk.Served = ticket, lastPos, served
		}
	}
}

// abandon cancels a queued request after ctx ended and builds the error.
func (t *Tracker) abandon(ctx context.Context, what string, tk proto.LeaseTicket, start time.Time) error {
	if tk.Ticket != "" {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		t.c.Call(cctx, proto.MethodLeaseCancel, proto.LeaseWaitArgs{Ticket: tk.Ticket}, nil)
		cancel()
	}
	if errors.Is(ctx.Err(), context.Canceled) {
		return fmt.Errorf("request lease for %s: cancelled after waiting %s: %w", what, time.Since(start).Round(time.Millisecond), proto.ErrCancelled)
	}
	served := "no live device serves it"
	if tk.Served {
		served = "every matching device stayed busy"
	}
	return fmt.Errorf("request lease for %s: gave up at the deadline after waiting %s at queue position %d (%s): %w",
		what, time.Since(start).Round(time.Millisecond), tk.Position, served, proto.ErrDeadline)
}

func describeRequest(r LeaseRequest) string {
	switch {
	case r.Key != "" && r.Selector != "":
		return fmt.Sprintf("key %q with selector %q", r.Key, r.Selector)
	case r.Key != "":
		return fmt.Sprintf("key %q", r.Key)
	case r.Selector != "":
		return fmt.Sprintf("selector %q", r.Selector)
	}
	return "any device"
}

func (t *Tracker) newLease(pl proto.Lease, noRenew bool) *Lease {
	l := &Lease{Lease: pl, t: t, stop: make(chan struct{}), expires: pl.Expires}
	if noRenew || pl.TTL <= 0 {
		l.stopped = true
		return l
	}
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		l.stopped = true
		return l
	}
	t.leases[l] = struct{}{}
	t.mu.Unlock()
	l.wg.Go(l.renewLoop)
	return l
}

func (l *Lease) renewLoop() {
	tick := time.NewTicker(max(l.TTL/3, 10*time.Millisecond))
	defer tick.Stop()
	for {
		select {
		case <-l.stop:
			return
		case <-tick.C:
			ctx, cancel := context.WithTimeout(context.Background(), max(l.TTL/3, time.Second))
			err := l.Renew(ctx)
			cancel()
			if errors.Is(err, proto.ErrSessionExpired) || errors.Is(err, proto.ErrUnavailable) {
				l.mu.Lock()
				l.err = err
				l.mu.Unlock()
				l.t.log.Warn("lease renewal stopped", "lease", l.ID, "err", err)
				return
			}
		}
	}
}

// Err returns why automatic renewal stopped (the lease expired on the
// tracker, or the connection dropped), nil while it runs.
func (l *Lease) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

func (l *Lease) stopRenewing() {
	l.mu.Lock()
	if !l.stopped {
		l.stopped = true
		close(l.stop)
	}
	l.mu.Unlock()
	l.wg.Wait()
	l.t.mu.Lock()
	delete(l.t.leases, l)
	l.t.mu.Unlock()
}

// Renew extends the lease by its TTL.
func (l *Lease) Renew(ctx context.Context) error {
	var out proto.Lease
	if err := l.t.c.Call(ctx, proto.MethodLeaseRenew, proto.LeaseRenewArgs{ID: l.ID, Token: l.Token}, &out); err != nil {
		return fmt.Errorf("renew lease %s: %w", l.ID, err)
	}
	l.mu.Lock()
	l.expires = out.Expires
	l.mu.Unlock()
	return nil
}

// Expiry returns when the lease ends unless renewed again (the embedded
// Expires is the first grant's).
func (l *Lease) Expiry() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.expires
}

// Release stops renewal and gives the device back.
func (l *Lease) Release(ctx context.Context) error {
	l.stopRenewing()
	if err := l.t.c.Call(ctx, proto.MethodLeaseRelease, proto.LeaseRenewArgs{ID: l.ID, Token: l.Token}, nil); err != nil {
		return fmt.Errorf("release lease %s: %w", l.ID, err)
	}
	return nil
}

// ReportFailure tells the tracker the leased device failed; repeated
// failures quarantine it.
func (l *Lease) ReportFailure(ctx context.Context, message string) error {
	args := proto.ReportArgs{LeaseID: l.ID, Token: l.Token, Kind: proto.ReportFailure, Message: message}
	if err := l.t.c.Call(ctx, proto.MethodTrackerReport, args, nil); err != nil {
		return fmt.Errorf("report failure of lease %s: %w", l.ID, err)
	}
	return nil
}

// SubmitBuild queues a build job.
func (t *Tracker) SubmitBuild(ctx context.Context, args proto.BuildSubmitArgs) (proto.BuildJob, error) {
	var j proto.BuildJob
	if err := t.c.Call(ctx, proto.MethodBuildSubmit, args, &j); err != nil {
		return j, fmt.Errorf("submit build: %w", err)
	}
	return j, nil
}

// BuildStatus returns a job as the tracker sees it now.
func (t *Tracker) BuildStatus(ctx context.Context, id string) (proto.BuildJob, error) {
	var j proto.BuildJob
	if err := t.c.Call(ctx, proto.MethodBuildStatus, proto.BuildJobArgs{ID: id}, &j); err != nil {
		return j, fmt.Errorf("build job %s: %w", id, err)
	}
	return j, nil
}

// ErrBuildFailed is wrapped by WaitBuild's error when the job ended failed
// or cancelled.
var ErrBuildFailed = errors.New("build failed")

// WaitBuild waits until the job is final, calling onChange (when set) with
// each change it sees (state, progress). A job that ended failed or
// cancelled is returned with an error wrapping ErrBuildFailed that carries
// the compiler's message.
func (t *Tracker) WaitBuild(ctx context.Context, id string, onChange func(proto.BuildJob)) (proto.BuildJob, error) {
	var seq uint64
	for {
		var j proto.BuildJob
		if err := t.c.Call(ctx, proto.MethodBuildWait, proto.BuildWaitArgs{ID: id, Seq: seq}, &j); err != nil {
			return j, fmt.Errorf("wait for build job %s: %w", id, err)
		}
		if j.Seq != seq && onChange != nil {
			onChange(j)
		}
		seq = j.Seq
		switch j.State {
		case proto.JobSucceeded:
			return j, nil
		case proto.JobFailed, proto.JobCancelled:
			return j, fmt.Errorf("build job %s %s: %s: %w", id, j.State, j.Error, ErrBuildFailed)
		}
	}
}

// CancelBuild cancels a queued or running job; a final job is returned as is.
func (t *Tracker) CancelBuild(ctx context.Context, id string) (proto.BuildJob, error) {
	var j proto.BuildJob
	if err := t.c.Call(ctx, proto.MethodBuildCancel, proto.BuildJobArgs{ID: id}, &j); err != nil {
		return j, fmt.Errorf("cancel build job %s: %w", id, err)
	}
	return j, nil
}

// DownloadArtifact copies the artifact with the given sha256 to w.
func (t *Tracker) DownloadArtifact(ctx context.Context, sha string, w io.Writer) (int64, error) {
	n, err := t.c.Download(ctx, proto.BulkArtifactDownload, sha, w)
	if err != nil {
		return n, fmt.Errorf("download artifact %s: %w", sha, err)
	}
	return n, nil
}

// UploadArtifact stores size bytes of r on the tracker under sha (their
// sha256, lowercase hex).
func (t *Tracker) UploadArtifact(ctx context.Context, sha string, size int64, r io.Reader) error {
	return uploadArtifact(ctx, t.c, sha, size, r)
}

func uploadArtifact(ctx context.Context, c *proto.Client, sha string, size int64, r io.Reader) error {
	if err := c.Upload(ctx, proto.BulkArtifactUpload, sha, size, r); err != nil {
		return fmt.Errorf("upload artifact %s: %w", sha, err)
	}
	return nil
}

// FileSHA256 returns the lowercase hex sha256 and size of a file, the name
// an artifact is stored under.
func FileSHA256(path string) (string, int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", 0, fmt.Errorf("hash %s: %w", path, err)
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return "", 0, fmt.Errorf("hash %s: %w", path, err)
	}
	return hex.EncodeToString(h.Sum(nil)), n, nil
}
