package client

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/vmihailenco/msgpack/v5"

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
	// NodeIDFile, for a Registrar, is where it keeps the node id the
	// tracker gave it, so that a restarted node registers under the same
	// id (its leases, failures and quarantine stay its own). Not used
	// with a CredentialFile: the credential names the node.
	NodeIDFile string
	// TLS, when set, dials over TLS (see proto.TLSConfig.Client).
	TLS *tls.Config
	// HandshakeTimeout bounds the dial and hello (proto's default when 0).
	HandshakeTimeout time.Duration
	// Logger receives debug logs (slog.Default() when nil).
	Logger *slog.Logger
	// FailoverTimeout bounds how long one call keeps trying to reach a
	// tracker (this replica again, or another) after its connection
	// failed (DefaultFailoverTimeout when 0).
	FailoverTimeout time.Duration
}

func (o TrackerOptions) dial(ctx context.Context, addr string, role proto.Role) (*proto.Client, error) {
	return proto.Dial(ctx, addr, proto.DialOptions{
		Role: role, Token: o.Token, TLS: o.TLS, HandshakeTimeout: o.HandshakeTimeout, Logger: o.logger(),
		Expect: proto.ListenerTracker,
	})
}

func (o TrackerOptions) logger() *slog.Logger {
	if o.Logger == nil {
		return slog.Default()
	}
	return o.Logger
}

// Tracker is a client's connection to a tracker. It is safe for
// concurrent use. Given several tracker replicas (DialTracker), it fails
// over between them: a call whose connection drops, or that a replica
// answers unavailable, is made again on a connection to the next
// reachable replica (see the methods for what resumes how).
type Tracker struct {
	addrs *trackerAddrs
	opts  TrackerOptions
	log   *slog.Logger

	dialing chan struct{} // held (one element in it) by the one redial at a time

	mu     sync.Mutex
	c      *proto.Client
	addr   string // c's tracker
	leases map[*Lease]struct{}
	closed bool
}

// DialTracker connects to a tracker as a client. addrs is one HOST:PORT or
// several separated by commas (tracker replicas); a name may resolve to
// several addresses. The first reachable one is used.
func DialTracker(ctx context.Context, addrs string, opts TrackerOptions) (*Tracker, error) {
	t := &Tracker{addrs: newTrackerAddrs(addrs), opts: opts, log: opts.logger(), leases: make(map[*Lease]struct{}), dialing: make(chan struct{}, 1)}
	c, addr, err := opts.dialAny(ctx, t.addrs, proto.RoleClient)
	if err != nil {
		return nil, fmt.Errorf("connect to tracker: %w", err)
	}
	t.c, t.addr = c, addr
	return t, nil
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
	c := t.c
	t.mu.Unlock()
	for _, l := range leases {
		l.stopRenewing()
	}
	return c.Close()
}

// Addr returns the address of the tracker the connection is to now.
func (t *Tracker) Addr() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.addr
}

// conn returns a live connection, dialling the replicas (with backoff)
// until one answers, ctx ends or the failover time since since is spent.
func (t *Tracker) conn(ctx context.Context, since time.Time) (*proto.Client, error) {
	if c, err := t.current(); c != nil || err != nil {
		return c, err
	}
	select {
	case t.dialing <- struct{}{}:
		defer func() { <-t.dialing }()
	case <-ctx.Done():
		return nil, fmt.Errorf("reconnect to tracker: %w", proto.ErrUnavailable)
	}
	b := newBackoff()
	for {
		if c, err := t.current(); c != nil || err != nil {
			return c, err
		}
		c, addr, err := t.opts.dialAny(ctx, t.addrs, proto.RoleClient)
		if err == nil {
			t.mu.Lock()
			if t.closed { // closed while dialling
				t.mu.Unlock()
				c.Close()
				return nil, fmt.Errorf("tracker connection closed: %w", proto.ErrUnavailable)
			}
			old := t.c
			t.c, t.addr = c, addr
			t.mu.Unlock()
			old.Close()
			t.log.Info("connected to tracker", "tracker", addr)
			return c, nil
		}
		if !retryable(err) || time.Since(since) > t.opts.failoverTimeout() || !b.wait(ctx) {
			return nil, fmt.Errorf("reconnect to tracker: %w", err)
		}
	}
}

// current returns the connection while it is up, nil when it needs a
// redial, or an error once the Tracker is closed.
func (t *Tracker) current() (*proto.Client, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil, fmt.Errorf("tracker connection closed: %w", proto.ErrUnavailable)
	}
	if t.c.Err() != nil {
		return nil, nil
	}
	return t.c, nil
}

// drop marks c failed (err wraps ErrUnavailable): the next call dials the
// replica after its one.
func (t *Tracker) drop(c *proto.Client, err error) {
	t.mu.Lock()
	addr := t.addr
	mine := t.c == c
	t.mu.Unlock()
	if !mine {
		return
	}
	t.log.Warn("tracker connection lost; failing over", "tracker", addr, "err", err)
	t.addrs.markFailed(addr)
	c.Close()
}

// do runs fn on a live connection, again on a new one (up to the failover
// time) while it fails with a retryable error.
func (t *Tracker) do(ctx context.Context, fn func(c *proto.Client, try int) error) error {
	get := func(since time.Time) (*proto.Client, error) { return t.conn(ctx, since) }
	return retryOn(ctx, t.opts.failoverTimeout(), get, t.drop, fn)
}

// call runs method on the tracker, failing over as do does.
func (t *Tracker) call(ctx context.Context, method string, args, result any) error {
	return t.do(ctx, func(c *proto.Client, _ int) error { return c.Call(ctx, method, args, result) })
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
	if err := t.call(ctx, proto.MethodTrackerQuery, a, &sum); err != nil {
		return sum, fmt.Errorf("query tracker: %w", err)
	}
	return sum, nil
}

// SubmitBuild queues a build job. A submission whose connection fails is
// sent again to the next replica under the same SubmitKey (a random one
// unless args has one), so it queues one job, never two. A module over
// proto.MaxInlineModule bytes is streamed (see SubmitBuildFrom).
func (t *Tracker) SubmitBuild(ctx context.Context, args proto.BuildSubmitArgs) (proto.BuildJob, error) {
	if !proto.StoredFormat(args.Format) && len(args.Module) > proto.MaxInlineModule {
		text := args.Module
		args.Module = ""
		return t.SubmitBuildFrom(ctx, args, int64(len(text)), strings.NewReader(text))
	}
	if args.SubmitKey == "" {
		args.SubmitKey = randomKey()
	}
	var j proto.BuildJob
	if err := t.call(ctx, proto.MethodBuildSubmit, args, &j); err != nil {
		return j, fmt.Errorf("submit build: %w", err)
	}
	return j, nil
}

// SubmitBuildFrom queues a build job whose module is the size bytes r
// yields (args.Module empty), streamed to the tracker, which writes them
// to its module store as they arrive: neither end holds the module
// whole. The digest the tracker reports must be that of the bytes sent.
// A submission whose connection fails is sent again when r can start over
// (an io.Seeker), under the same SubmitKey.
func (t *Tracker) SubmitBuildFrom(ctx context.Context, args proto.BuildSubmitArgs, size int64, r io.Reader) (proto.BuildJob, error) {
	if args.Module != "" {
		return proto.BuildJob{}, fmt.Errorf("submit build: the module is the stream's, args.Module must be empty: %w", proto.ErrBadRequest)
	}
	if args.SubmitKey == "" {
		args.SubmitKey = randomKey()
	}
	head, err := proto.EncodeFrame(args, proto.MaxSubmitArgs)
	if err != nil {
		return proto.BuildJob{}, fmt.Errorf("submit build: %w", err)
	}
	var j proto.BuildJob
	err = t.do(ctx, func(c *proto.Client, try int) error {
		if try > 0 {
			sk, ok := r.(io.Seeker)
			if !ok {
				return finalError{fmt.Errorf("the tracker connection failed and the module cannot be read again: %w", proto.ErrUnavailable)}
			}
			if _, err := sk.Seek(0, io.SeekStart); err != nil {
				return finalError{fmt.Errorf("rewind the module for a retry: %w", err)}
			}
		}
		h := sha256.New()
		body := io.MultiReader(bytes.NewReader(head), io.TeeReader(io.LimitReader(r, size), h))
		var reply bytes.Buffer
		_, err := c.Bulk(ctx, proto.BulkBuildSubmit, proto.Bulk{Name: args.Name, Size: int64(len(head)) + size, Body: body}, limitWriter{&reply, proto.MaxSubmitArgs})
		if err != nil {
			return err
		}
		j = proto.BuildJob{}
		if err := msgpack.Unmarshal(reply.Bytes(), &j); err != nil {
			return fmt.Errorf("decode the job queued: %v: %w", err, proto.ErrInternal)
		}
		if sent := hex.EncodeToString(h.Sum(nil)); j.ModuleSHA256 != "" && j.ModuleSHA256 != sent {
			c.Call(ctx, proto.MethodBuildCancel, proto.BuildJobArgs{ID: j.ID}, nil)
			return finalError{fmt.Errorf("job %s: the tracker stored a module hashing to %s, not the %s sent: %w", j.ID, j.ModuleSHA256, sent, proto.ErrInternal)}
		}
		return nil
	})
	if err != nil {
		return j, fmt.Errorf("submit build: %w", err)
	}
	return j, nil
}

// limitWriter is a bytes.Buffer that takes at most max bytes.
type limitWriter struct {
	b   *bytes.Buffer
	max int
}

func (w limitWriter) Write(p []byte) (int, error) {
	if w.b.Len()+len(p) > w.max {
		return 0, fmt.Errorf("reply of over %d bytes: %w", w.max, proto.ErrTooLarge)
	}
	return w.b.Write(p)
}

// BuildStatus returns a job as the tracker sees it now.
func (t *Tracker) BuildStatus(ctx context.Context, id string) (proto.BuildJob, error) {
	var j proto.BuildJob
	if err := t.call(ctx, proto.MethodBuildStatus, proto.BuildJobArgs{ID: id}, &j); err != nil {
		return j, fmt.Errorf("build job %s: %w", id, err)
	}
	return j, nil
}

// ErrBuildFailed is wrapped by WaitBuild's error when the job ended failed
// or cancelled.
var ErrBuildFailed = errors.New("build failed")

// WaitBuild waits until the job is final, calling onChange (when set) with
// each change it sees (state, progress, and while it is queued its
// position in the queue). A job that ended failed or
// cancelled is returned with an error wrapping ErrBuildFailed that carries
// the compiler's message. When the tracker connection fails it waits on
// for the same job through the next replica.
func (t *Tracker) WaitBuild(ctx context.Context, id string, onChange func(proto.BuildJob)) (proto.BuildJob, error) {
	var seq uint64
	pos := -1 // the first answer comes at once with the job's position
	for {
		var j proto.BuildJob
		if err := t.call(ctx, proto.MethodBuildWait, proto.BuildWaitArgs{ID: id, Seq: seq, Position: pos}, &j); err != nil {
			return j, fmt.Errorf("wait for build job %s: %w", id, err)
		}
		if (j.Seq != seq || j.Position != pos) && onChange != nil {
			onChange(j)
		}
		seq, pos = j.Seq, j.Position
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
	if err := t.call(ctx, proto.MethodBuildCancel, proto.BuildJobArgs{ID: id}, &j); err != nil {
		return j, fmt.Errorf("cancel build job %s: %w", id, err)
	}
	return j, nil
}

// DownloadArtifact copies the artifact with the given sha256 to w. A
// download whose connection fails is made again through the next replica
// when nothing was written yet or w can start over (an *os.File, a
// *bytes.Buffer).
func (t *Tracker) DownloadArtifact(ctx context.Context, sha string, w io.Writer) (int64, error) {
	return downloadVia(ctx, t.do, sha, w)
}

// UploadArtifact stores size bytes of r on the tracker under sha (their
// sha256, lowercase hex). An upload whose connection fails is made again
// through the next replica when r can start over (an io.Seeker).
func (t *Tracker) UploadArtifact(ctx context.Context, sha string, size int64, r io.Reader) error {
	return t.do(ctx, func(c *proto.Client, try int) error { return uploadArtifact(ctx, c, sha, size, r, try) })
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
