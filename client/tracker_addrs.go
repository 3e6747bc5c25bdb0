package client

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/kiln-ml/kiln/rpcserver/proto"
)

// DefaultFailoverTimeout is how long a call keeps trying to reach a
// tracker after its connection failed when TrackerOptions.FailoverTimeout
// is 0.
const DefaultFailoverTimeout = 30 * time.Second

// ParseTrackerAddrs checks a tracker address list as --tracker takes it:
// one or more HOST:PORT separated by commas. A HOST that is a name may
// resolve to several addresses (one per tracker replica): every one of
// them is tried when the connection is made. It returns the entries as
// given.
func ParseTrackerAddrs(spec string) ([]string, error) {
	if strings.TrimSpace(spec) == "" {
		return nil, errors.New("no tracker address given (want HOST:PORT, or several separated by commas)")
	}
	var out []string
	for i, e := range strings.Split(spec, ",") {
		e = strings.TrimSpace(e)
		if e == "" {
			return nil, fmt.Errorf("tracker address list %q: entry %d is empty", spec, i+1)
		}
		host, port, err := net.SplitHostPort(e)
		if err != nil {
			return nil, fmt.Errorf("tracker address %q: want HOST:PORT: %v", e, err)
		}
		if host == "" || port == "" {
			return nil, fmt.Errorf("tracker address %q: want HOST:PORT with both parts", e)
		}
		out = append(out, e)
	}
	return out, nil
}

// trackerAddrs is the tracker replicas a connection fails over between:
// the addresses as given, resolved again at every dial (a name's records
// may change while a node runs), tried from the one after the address
// that failed last.
type trackerAddrs struct {
	given []string
	err   error // from parsing; every dial returns it

	mu     sync.Mutex
	failed string // the address whose connection failed last
}

func newTrackerAddrs(spec string) *trackerAddrs {
	given, err := ParseTrackerAddrs(spec)
	return &trackerAddrs{given: given, err: err}
}

func (a *trackerAddrs) String() string { return strings.Join(a.given, ",") }

// dialTarget is one address to dial and the name its TLS certificate must
// carry (the name it was resolved from).
type dialTarget struct{ addr, serverName string }

// resolve expands every name to its addresses, in the resolver's order;
// a name that does not resolve is kept, so that the dial's error names it.
func (a *trackerAddrs) resolve(ctx context.Context) []dialTarget {
	var out []dialTarget
	seen := make(map[string]bool)
	add := func(t dialTarget) {
		if !seen[t.addr] {
			seen[t.addr] = true
			out = append(out, t)
		}
	}
	for _, g := range a.given {
		host, port, _ := net.SplitHostPort(g)
		if net.ParseIP(host) != nil {
			add(dialTarget{addr: g})
			continue
		}
		ips, err := net.DefaultResolver.LookupHost(ctx, host)
		if err != nil || len(ips) == 0 {
			add(dialTarget{addr: g})
			continue
		}
		for _, ip := range ips {
			add(dialTarget{addr: net.JoinHostPort(ip, port), serverName: host})
		}
	}
	return out
}

// markFailed records that the connection to addr failed: the next dial
// starts with the address after it.
func (a *trackerAddrs) markFailed(addr string) {
	a.mu.Lock()
	a.failed = addr
	a.mu.Unlock()
}

// order returns ts starting after the address that failed last.
func (a *trackerAddrs) order(ts []dialTarget) []dialTarget {
	a.mu.Lock()
	failed := a.failed
	a.mu.Unlock()
	for i, t := range ts {
		if t.addr == failed {
			return append(ts[i+1:len(ts):len(ts)], ts[:i+1]...)
		}
	}
	return ts
}

// dialAny connects to the first reachable tracker of addrs. It fails at
// once when a tracker refuses the hello (a refused or revoked token,
// another protocol version): replicas of one fleet answer alike. When none
// is reachable the error wraps ErrUnavailable and names each address with
// its failure.
func (o TrackerOptions) dialAny(ctx context.Context, addrs *trackerAddrs, role proto.Role) (*proto.Client, string, error) {
	if addrs.err != nil {
		return nil, "", fatalError{addrs.err}
	}
	var fails []string
	for _, t := range addrs.order(addrs.resolve(ctx)) {
		c, err := o.dialTarget(ctx, t, role)
		if err == nil {
			return c, t.addr, nil
		}
		if pk := (*proto.PeerKindError)(nil); errors.As(err, &pk) {
			return nil, t.addr, err // it names the address
		}
		if !errors.Is(err, proto.ErrUnavailable) || ctx.Err() != nil {
			return nil, t.addr, fmt.Errorf("tracker %s: %w", t.addr, err)
		}
		fails = append(fails, fmt.Sprintf("%s: %v", t.addr, err))
		addrs.markFailed(t.addr)
	}
	return nil, "", fmt.Errorf("no tracker reachable of %s (%s): %w", addrs, strings.Join(fails, "; "), proto.ErrUnavailable)
}

func (o TrackerOptions) dialTarget(ctx context.Context, t dialTarget, role proto.Role) (*proto.Client, error) {
	if o.TLS != nil && o.TLS.ServerName == "" && t.serverName != "" {
		o.TLS = o.TLS.Clone()
		o.TLS.ServerName = t.serverName
	}
	return o.dial(ctx, t.addr, role)
}

func (o TrackerOptions) failoverTimeout() time.Duration {
	if o.FailoverTimeout > 0 {
		return o.FailoverTimeout
	}
	return DefaultFailoverTimeout
}

// backoff spaces reconnection attempts: each wait is jittered around the
// current step (half to one and a half of it), which doubles up to max.
type backoff struct{ min, max, cur time.Duration }

func newBackoff() *backoff {
	const minStep, maxStep = 50 * time.Millisecond, time.Second
	return &backoff{min: minStep, max: maxStep, cur: minStep}
}

// wait sleeps one step, returning false when ctx ends first.
func (b *backoff) wait(ctx context.Context) bool {
	d := b.cur/2 + rand.N(b.cur)
	b.cur = min(2*b.cur, b.max)
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

func (b *backoff) reset() { b.cur = b.min }

// retryable reports whether err means the tracker went away (the
// connection dropped, or a replica that lost its store answered
// unavailable): the call may go to another replica, unless it is a
// finalError.
func retryable(err error) bool {
	var f finalError
	return errors.Is(err, proto.ErrUnavailable) && !errors.As(err, &f)
}
