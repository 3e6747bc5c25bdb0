package tracker

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	metricsrv "github.com/kiln-ml/kiln/internal/metrics"
	"github.com/kiln-ml/kiln/rpcserver/proto"
	"github.com/kiln-ml/kiln/tracker/store"
)

// replica is a tracker run as one of several over one etcd cluster. Each
// campaigns to lead; the leader loads the state from etcd and serves as a
// single tracker does, its writes fenced by its leadership (see
// store.Etcd); the others forward every connection to it byte for byte.
// Leadership ends when its etcd session does (the process died, or lost
// etcd for ElectionTTL), when a write fails its fence, or at stop; the
// term's tracker then stops, closing its connections, and the replica
// campaigns again.
type replica struct {
	s          *Server // the tracker that holds the listeners
	cfg        Config
	log        *slog.Logger
	cli        *clientv3.Client
	member     *member // nil without an embedded member
	memberOnce sync.Once
	prefix     string // the keys of this fleet: prefix+"state/", prefix+"election/"
	self       leaderInfo
	fwd        proxies
	leaseKey   []byte // makes lease tokens (see leasetoken.go)

	mu     sync.Mutex
	leader leaderInfo // the leader as last observed
	// leaderLease is the leader's session lease; refusals counts the
	// forwarded connections its address refused in a row, since
	// refusedSince.
	leaderLease  int64
	refusals     int
	refusedSince time.Time
	term         *leaderTerm // set while this replica leads and serves
	etcdErr      error       // the last probe of etcd, nil when it answered
}

// leaderInfo is what a leader advertises: the value of its election key.
type leaderInfo struct {
	ID   string `json:"id"`
	Kiln string `json:"kiln"`
	TVM  string `json:"tvm,omitempty"`
}

// leaderTerm is one leadership: the tracker serving it and its listeners.
type leaderTerm struct {
	srv *Server
	ho  *handoff
}

// leaderMetric is 1 on the replica that leads, 0 on the others.
const (
	leaderMetric     = "kiln_tracker_leader"
	leaderMetricHelp = "1 while this tracker replica leads (and exports the tracker's gauges), 0 while it forwards to the leader."
)

// etcdProbeEvery is how often a replica checks that etcd answers.
const etcdProbeEvery = 500 * time.Millisecond

func (r *replica) electionPrefix() string { return r.prefix + "election/" }

// run serves until ctx ends: it accepts every connection, campaigns,
// leads when elected and forwards to the leader otherwise.
func (r *replica) run(ctx context.Context) error {
	r.log.Info("tracker replica serving", "addr", r.s.Addr(), "advertise", r.self.Kiln, "tvm", r.s.TVMAddr(), "metrics", r.s.MetricsAddr(), "id", r.self.ID)
	var wg sync.WaitGroup
	errc := make(chan error, 3)
	wg.Go(func() { errc <- acceptAll(r.s.ln, func(c net.Conn) { r.route(c, false) }) })
	if r.s.tvmLn != nil {
		wg.Go(func() { errc <- acceptAll(r.s.tvmLn, func(c net.Conn) { r.route(c, true) }) })
	}
	if r.s.metricsLn != nil {
		srv := metricsrv.NewServer(r.metricsHandler())
		wg.Go(func() {
			if err := metricsrv.Serve(srv, r.s.metricsLn); err != nil && !errors.Is(err, http.ErrServerClosed) {
				errc <- fmt.Errorf("tracker metrics: %w", err)
			}
		})
		wg.Go(func() {
			<-ctx.Done()
			sctx, c := context.WithTimeout(context.Background(), 5*time.Second)
			defer c()
			srv.Shutdown(sctx)
		})
	}
	lctx, cancel := context.WithCancel(ctx)
	wg.Go(func() { r.observe(lctx) })
	wg.Go(func() { r.probe(lctx) })
	wg.Go(func() { r.campaign(lctx) })
	var err error
	select {
	case <-ctx.Done():
	case err = <-errc:
	}
	cancel()
	r.s.mu.Lock()
	r.s.stopping = true
	r.s.mu.Unlock()
	r.s.closeListeners()
	r.fwd.closeAll()
	wg.Wait()
	r.log.Info("tracker replica stopped", "id", r.self.ID)
	return err
}

// route serves c in this replica's term when it leads, or forwards it to
// the leader; with no leader known it closes c, and the client tries
// again.
func (r *replica) route(c net.Conn, tvm bool) {
	r.mu.Lock()
	t, leader := r.term, r.leader
	r.mu.Unlock()
	if t != nil {
		if tvm {
			t.ho.tvm.hand(c)
		} else {
			t.ho.kiln.hand(c)
		}
		return
	}
	addr := leader.Kiln
	if tvm {
		addr = leader.TVM
	}
	if leader.ID == "" || leader.ID == r.self.ID || addr == "" {
		c.Close()
		return
	}
	if err := r.fwd.forward(c, leader.ID, addr); errors.Is(err, syscall.ECONNREFUSED) {
		r.leaderRefused(leader)
	}
}

// deadLeaderRefusals is how many forwarded connections in a row the
// leader's address must refuse, over at least deadLeaderSpan, before a
// follower ends the leader's session.
const (
	deadLeaderRefusals = 3
	deadLeaderSpan     = 300 * time.Millisecond
)

// leaderRefused counts a refused connection to leader. A leader whose
// advertised address refuses connection after connection has no process
// listening there: rather than wait for its session to lapse, a follower
// revokes it, which ends the leadership at once. It is safe whatever the
// truth: a leader whose session is gone can no longer write (its fence
// fails), it only stops leading.
func (r *replica) leaderRefused(leader leaderInfo) {
	r.mu.Lock()
	if r.leader != leader || r.leaderLease == 0 {
		r.mu.Unlock()
		return
	}
	now := time.Now()
	if r.refusals == 0 {
		r.refusedSince = now
	}
	r.refusals++
	lease := r.leaderLease
	dead := r.refusals >= deadLeaderRefusals && now.Sub(r.refusedSince) >= deadLeaderSpan
	if dead {
		r.refusals = 0
	}
	r.mu.Unlock()
	if !dead {
		return
	}
	r.log.Warn("the leader refuses connections: ending its session", "leader", leader.ID, "addr", leader.Kiln)
	ctx, cancel := context.WithTimeout(context.Background(), store.EtcdProbeTimeout)
	defer cancel()
	if _, err := r.cli.Revoke(ctx, clientv3.LeaseID(lease)); err != nil {
		r.log.Warn("end the dead leader's session", "leader", leader.ID, "err", err)
	}
}

// observe follows the election: the leader is the candidate whose key was
// made first.
func (r *replica) observe(ctx context.Context) {
	b := newRetry()
	for ctx.Err() == nil {
		rev, err := r.readLeader(ctx)
		if err != nil {
			b.wait(ctx)
			continue
		}
		b.reset()
		wch := r.cli.Watch(clientv3.WithRequireLeader(ctx), r.electionPrefix(), clientv3.WithPrefix(), clientv3.WithRev(rev+1))
		for resp := range wch {
			if resp.Err() != nil {
				break
			}
			if _, err := r.readLeader(ctx); err != nil {
				break
			}
		}
	}
}

// readLeader reads the current leader and records it, closing forwarded
// connections when it changed; it returns the revision it read at.
func (r *replica) readLeader(ctx context.Context) (int64, error) {
	cctx, cancel := context.WithTimeout(ctx, store.EtcdCallTimeout)
	defer cancel()
	resp, err := r.cli.Get(cctx, r.electionPrefix(), clientv3.WithFirstCreate()...)
	if err != nil {
		return 0, err
	}
	var l leaderInfo
	if len(resp.Kvs) > 0 {
		if err := json.Unmarshal(resp.Kvs[0].Value, &l); err != nil {
			r.log.Warn("unreadable election value", "key", string(resp.Kvs[0].Key), "err", err)
		}
	}
	var lease int64
	if len(resp.Kvs) > 0 {
		lease = resp.Kvs[0].Lease
	}
	r.mu.Lock()
	changed := l != r.leader
	r.leader, r.leaderLease = l, lease
	if changed {
		r.refusals = 0
	}
	r.mu.Unlock()
	if changed {
		r.log.Info("tracker leader", "id", l.ID, "addr", l.Kiln, "self", l.ID == r.self.ID)
		r.fwd.leaderChanged(l.ID)
	}
	return resp.Header.Revision, nil
}

// probe records now and then whether etcd answers, for ready.
func (r *replica) probe(ctx context.Context) {
	tick := time.NewTicker(etcdProbeEvery)
	defer tick.Stop()
	for {
		cctx, cancel := context.WithTimeout(ctx, store.EtcdProbeTimeout)
		_, err := r.cli.Get(cctx, r.electionPrefix(), clientv3.WithCountOnly())
		cancel()
		r.mu.Lock()
		r.etcdErr = err
		t := r.term
		r.mu.Unlock()
		if t != nil {
			t.srv.st.Probe(ctx)
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// campaign campaigns for leadership, leads while elected, and campaigns
// again, until ctx ends.
func (r *replica) campaign(ctx context.Context) {
	b := newRetry()
	ttl := max(1, int(r.cfg.ElectionTTL/time.Second))
	val, _ := json.Marshal(r.self)
	for ctx.Err() == nil {
		sess, err := concurrency.NewSession(r.cli, concurrency.WithTTL(ttl), concurrency.WithContext(ctx))
		if err != nil {
			r.log.Warn("etcd session", "err", err)
			b.wait(ctx)
			continue
		}
		el := concurrency.NewElection(sess, r.electionPrefix())
		cctx, cancel := context.WithCancel(ctx)
		go func() {
			select {
			case <-sess.Done():
			case <-cctx.Done():
			}
			cancel()
		}()
		if err := el.Campaign(cctx, string(val)); err == nil {
			b.reset()
			r.lead(cctx, sess, el)
		} else if ctx.Err() == nil {
			b.wait(ctx)
		}
		cancel()
		// Hand the leadership on at once when etcd answers; otherwise it
		// lapses with the session.
		rctx, rcancel := context.WithTimeout(context.Background(), store.EtcdProbeTimeout)
		el.Resign(rctx)
		rcancel()
		sess.Orphan()
		rctx, rcancel = context.WithTimeout(context.Background(), store.EtcdProbeTimeout)
		r.cli.Revoke(rctx, sess.Lease())
		rcancel()
	}
}

// lead serves a term: it loads the state from etcd into a tracker of its
// own, whose writes hold only while this replica's election key is the
// one it made, and serves until ctx ends, the store is fenced or the
// tracker fails.
func (r *replica) lead(ctx context.Context, sess *concurrency.Session, el *concurrency.Election) {
	fence := []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(el.Key()), "=", el.Rev())}
	ho := newHandoff(r.s.ln, r.s.tvmLn)
	cfg := r.cfg
	cfg.MetricsListen = ""
	cfg.MaxModuleSize = min(cfg.MaxModuleSize, store.EtcdMaxValue) // a module is one etcd record
	cfg.Logger = r.log.With("term", el.Rev())
	var st *store.Etcd
	t0 := time.Now()
	srv, err := newServer(cfg, ho, func(s *Server) (store.Backend, error) {
		s.leaseKey = r.leaseKey
		st = store.OpenEtcd(r.cli, r.prefix+"state/", fence, store.Hooks{
			Synced: func(d time.Duration) { s.m.storeSync.Observe(d.Seconds()) },
		})
		return st, nil
	})
	if err != nil {
		r.log.Error("tracker replica cannot lead", "err", err)
		ho.close()
		select { // let another replica lead
		case <-ctx.Done():
		case <-time.After(r.cfg.ElectionTTL):
		}
		return
	}
	srv.m.reg.Flag(leaderMetric, leaderMetricHelp, true)
	r.log.Info("tracker replica leads", "id", r.self.ID, "term", el.Rev(), "load", time.Since(t0))
	runCtx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(runCtx) }()
	r.mu.Lock()
	r.term = &leaderTerm{srv: srv, ho: ho}
	r.mu.Unlock()
	var why string
	select {
	case <-ctx.Done():
		why = "stopping or etcd session lost"
	case <-st.Fenced():
		why = "a write failed its fence: another replica leads"
	case err := <-done:
		why = fmt.Sprintf("its tracker stopped: %v", err)
		done <- err
	}
	r.mu.Lock()
	r.term = nil
	r.mu.Unlock()
	st.Abandon() // what it could not write by now is another leader's to redo
	stop()
	ho.close()
	if err := <-done; err != nil {
		r.log.Warn("term's tracker", "err", err)
	}
	r.log.Info("tracker replica no longer leads", "id", r.self.ID, "term", el.Rev(), "why", why)
}

// currentTerm returns the tracker of this replica's term, nil while it
// does not lead.
func (r *replica) currentTerm() *Server {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.term == nil {
		return nil
	}
	return r.term.srv
}

// ready says whether this replica can serve: its term's tracker's
// readiness while it leads; while it follows, etcd answering and a leader
// known.
func (r *replica) ready() error {
	r.mu.Lock()
	t, leader, etcdErr := r.term, r.leader, r.etcdErr
	r.mu.Unlock()
	switch {
	case t != nil:
		return t.srv.Ready()
	case etcdErr != nil:
		return fmt.Errorf("etcd unreachable: %v: %w", etcdErr, proto.ErrUnavailable)
	case leader.ID == "":
		return fmt.Errorf("no tracker replica leads yet: %w", proto.ErrUnavailable)
	}
	return nil
}

// metricsHandler serves the leading term's metrics while this replica
// leads, its own otherwise, and the health probes.
func (r *replica) metricsHandler() http.Handler {
	mux := http.NewServeMux()
	own := r.s.m.reg.Handler()
	mux.HandleFunc("/metrics", func(w http.ResponseWriter, req *http.Request) {
		r.mu.Lock()
		t := r.term
		r.mu.Unlock()
		if t != nil {
			t.srv.m.reg.Handler().ServeHTTP(w, req)
			return
		}
		own.ServeHTTP(w, req)
	})
	metricsrv.HandleHealth(mux, r.s.Ready)
	return mux
}

// close closes the etcd client and stops the embedded member.
func (r *replica) close() error {
	var err error
	if r.cli != nil {
		err = r.cli.Close()
	}
	r.stopMember()
	if err != nil && !errors.Is(err, context.Canceled) {
		return fmt.Errorf("close etcd client: %w", err)
	}
	return nil
}

// stopMember stops the embedded etcd member, once.
func (r *replica) stopMember() {
	r.memberOnce.Do(func() {
		if r.member != nil {
			r.member.Close()
		}
	})
}

// retry is a capped exponential backoff.
type retry struct{ cur time.Duration }

func newRetry() *retry { return &retry{cur: 50 * time.Millisecond} }

func (b *retry) reset() { b.cur = 50 * time.Millisecond }

func (b *retry) wait(ctx context.Context) {
	select {
	case <-ctx.Done():
	case <-time.After(b.cur):
	}
	b.cur = min(2*b.cur, time.Second)
}
