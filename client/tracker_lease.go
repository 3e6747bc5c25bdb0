package client

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/kiln-ml/kiln/rpcserver/proto"
)

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
	// Arch is the architecture the artifact to run is built for ("arm64",
	// as the selector key "arch" names it): the tracker grants only a
	// device of it, and refuses at once when the key and selector match
	// only devices of others.
	Arch string
	// FailUnserved refuses the request at once when no registered device
	// matches the key and selector, instead of waiting for one.
	FailUnserved bool
}

// Lease is a granted lease. Unless NoRenew was set it renews itself at a
// third of its TTL until Release (or the Tracker's Close).
type Lease struct {
	proto.Lease
	t *Tracker

	mu      sync.Mutex
	expires time.Time
	err     error // why renewal stopped
	// ctx lives while the lease renews itself; cancel stops it.
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// RequestLease asks for a device and waits, queued, until one is granted or
// ctx ends. When ctx's deadline passes first the error wraps
// proto.ErrDeadline and says how long it waited, at which queue position,
// and whether any device serves the request at all.
func (t *Tracker) RequestLease(ctx context.Context, req LeaseRequest) (*Lease, error) {
	args := proto.LeaseRequestArgs{
		Key: req.Key, Selector: req.Selector, Priority: req.Priority,
		SessionTimeout: req.SessionTimeout, TTL: req.TTL, User: req.User,
		RequestKey: randomKey(), Arch: req.Arch, FailUnserved: req.FailUnserved,
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
	lastPos := -1
	since := time.Now()
	b := newBackoff()
	for {
		c, err := t.conn(callCtx, since)
		if err != nil {
			if ctx.Err() != nil {
				return nil, t.abandon(ctx, nil, what, proto.LeaseTicket{Position: lastPos}, start)
			}
			return nil, fmt.Errorf("request lease for %s: %w", what, err)
		}
		l, answered, err := t.requestOn(ctx, callCtx, c, args, req, what, start, &lastPos)
		if err == nil || !retryable(err) || ctx.Err() != nil {
			return l, err
		}
		// The connection (and the ticket, which belongs to it) is gone:
		// a lease granted to the ticket but not delivered was released
		// with it, so asking again cannot hold two.
		t.drop(c, err)
		if answered {
			since = time.Now()
			b.reset()
		} else if time.Since(since) > t.opts.failoverTimeout() || !b.wait(ctx) {
			return nil, fmt.Errorf("request lease for %s: %w", what, err)
		}
		t.log.Info("lease request queued again after the tracker connection failed", "request", what)
	}
}

// requestOn queues the request on c and waits there until it is granted,
// fails, or c fails (the error then wraps ErrUnavailable unchanged, for
// RequestLease to queue it again). answered says whether c answered at
// least once.
func (t *Tracker) requestOn(ctx, callCtx context.Context, c *proto.Client, args proto.LeaseRequestArgs, req LeaseRequest, what string, start time.Time, lastPos *int) (l *Lease, answered bool, err error) {
	var tk proto.LeaseTicket
	err = c.Call(callCtx, proto.MethodLeaseRequest, args, &tk)
	for {
		if err == nil && tk.Lease == nil && ctx.Err() != nil {
			return nil, answered, t.abandon(ctx, c, what, tk, start)
		}
		if err != nil {
			switch {
			case errors.Is(err, proto.ErrDeadline):
				return nil, answered, fmt.Errorf("request lease: %w", err)
			case ctx.Err() != nil:
				return nil, answered, t.abandon(ctx, c, what, tk, start)
			case retryable(err):
				return nil, answered, err
			}
			return nil, answered, fmt.Errorf("request lease for %s: %w", what, err)
		}
		answered = true
		if tk.Lease != nil {
			return t.newLease(*tk.Lease, req.NoRenew), true, nil
		}
		if tk.Position != *lastPos && req.OnPosition != nil {
			req.OnPosition(tk.Position, tk.Queue)
		}
		*lastPos = tk.Position
		ticket, served := tk.Ticket, tk.Served
		tk = proto.LeaseTicket{}
		err = c.Call(callCtx, proto.MethodLeaseWait, proto.LeaseWaitArgs{Ticket: ticket}, &tk)
		if tk.Ticket == "" {
			tk.Ticket, tk.Position, tk.Served = ticket, *lastPos, served
		}
	}
}

// abandon cancels a queued request after ctx ended and builds the error.
func (t *Tracker) abandon(ctx context.Context, c *proto.Client, what string, tk proto.LeaseTicket, start time.Time) error {
	if tk.Ticket != "" && c != nil {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		c.Call(cctx, proto.MethodLeaseCancel, proto.LeaseWaitArgs{Ticket: tk.Ticket}, nil)
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
	l := &Lease{Lease: pl, t: t, expires: pl.Expires}
	l.ctx, l.cancel = context.WithCancel(context.Background())
	if noRenew || pl.TTL <= 0 {
		l.cancel()
		return l
	}
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		l.cancel()
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
		case <-l.ctx.Done():
			return
		case <-tick.C:
			ctx, cancel := context.WithTimeout(l.ctx, max(l.TTL/3, time.Second))
			err := l.Renew(ctx)
			cancel()
			if l.ctx.Err() != nil {
				return
			}
			// A tracker that cannot be reached is tried again at the next
			// tick (Renew fails over between replicas) until the lease
			// would have expired.
			if errors.Is(err, proto.ErrSessionExpired) || (err != nil && !time.Now().Before(l.Expiry())) {
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
// tracker, or no tracker could be reached before it would have), nil while
// it runs.
func (l *Lease) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

func (l *Lease) stopRenewing() {
	l.cancel()
	l.wg.Wait()
	l.t.mu.Lock()
	delete(l.t.leases, l)
	l.t.mu.Unlock()
}

// Renew extends the lease by its TTL.
func (l *Lease) Renew(ctx context.Context) error {
	var out proto.Lease
	if err := l.t.call(ctx, proto.MethodLeaseRenew, proto.LeaseRenewArgs{ID: l.ID, Token: l.Token}, &out); err != nil {
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
	err := l.t.do(ctx, func(c *proto.Client, try int) error {
		err := c.Call(ctx, proto.MethodLeaseRelease, proto.LeaseRenewArgs{ID: l.ID, Token: l.Token}, nil)
		if try > 0 && errors.Is(err, proto.ErrSessionExpired) {
			return nil // the try whose connection dropped released it
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("release lease %s: %w", l.ID, err)
	}
	return nil
}

// ReportFailure tells the tracker the leased device failed; repeated
// failures quarantine it.
func (l *Lease) ReportFailure(ctx context.Context, message string) error {
	args := proto.ReportArgs{LeaseID: l.ID, Token: l.Token, Kind: proto.ReportFailure, Message: message}
	if err := l.t.call(ctx, proto.MethodTrackerReport, args, nil); err != nil {
		return fmt.Errorf("report failure of lease %s: %w", l.ID, err)
	}
	return nil
}
