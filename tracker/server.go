package tracker

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	metricsrv "github.com/kiln-ml/kiln/internal/metrics"
	"github.com/kiln-ml/kiln/rpcserver/proto"
	"github.com/kiln-ml/kiln/tracker/store"
)

// Server is a tracker. New opens its store and listeners; Run serves until
// its context is cancelled; Close (or the end of Run) stops it.
type Server struct {
	cfg     Config
	log     *slog.Logger
	st      store.Backend
	blobs   blobStore // the artifacts' bytes
	modules blobStore // queued and running jobs' module texts (see module.go)
	rpc     *proto.Server

	ln, tvmLn, metricsLn net.Listener
	httpSrv              *http.Server

	mu      sync.Mutex
	nodes   map[string]*node
	byKey   map[string]map[string]*node // devices by key
	queues  map[string]*queue
	tickets map[string]*ticket
	leases  map[string]*lease // by id
	byToken map[string]*lease // by the token's sha256 (tokenHash)
	// leaseKey makes lease tokens from lease ids (see leasetoken.go).
	leaseKey []byte
	// byRequest holds the leases granted to requests with a RequestKey.
	byRequest map[idemKey]*lease
	jobs      map[string]*job
	// submitting holds the submissions with a SubmitKey being persisted.
	submitting map[idemKey]chan struct{}
	pending    pendingSubmits // submissions counted against the queue's caps, not yet queued
	queued     []*job         // queued jobs in hand-out order (jobOrder)
	jobAvail   chan struct{}
	buildTimes []time.Duration // the last recentBuilds jobs' build times
	nextJob    uint64
	seq        uint64 // ticket order
	stopping   bool   // set when shutdown starts: dropped connections no longer mark nodes lost
	m          trackerMetrics
	arti       artIndex // artifact store accounting
	results    resultIndex

	users     *users                   // nil without a users file
	userConns map[*proto.Conn]struct{} // connections admitted with a user or join token or a node credential
	creds     creds                    // node credentials
	usersGen  uint64                   // the users file's generation the expiry loop last acted on

	tvm tvmState

	rep *replica // set when this tracker is one replica of several over etcd

	runMu     sync.Mutex
	running   bool
	runCancel context.CancelFunc
	runDone   chan struct{}
	closeOnce sync.Once
	closeErr  error
}

// New opens the tracker's store (DataDir/tracker.db, or etcd with
// Config.Store or Config.Cluster: then the tracker is one replica of
// several, see the package doc) and binds the configured listeners, so
// Addr, TVMAddr and MetricsAddr are known before Run.
func New(cfg Config) (*Server, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	if cfg.replicated() {
		return newReplica(cfg)
	}
	return newServer(cfg, nil, func(s *Server) (store.Backend, error) {
		var err error
		if s.leaseKey, err = fileLeaseKey(cfg.DataDir); err != nil {
			return nil, err
		}
		return store.OpenBolt(filepath.Join(cfg.DataDir, "tracker.db"), store.Hooks{
			Synced:       func(d time.Duration) { s.m.storeSync.Observe(d.Seconds()) },
			Checkpointed: func(d time.Duration) { s.m.storeCheckpoint.Observe(d.Seconds()) },
		})
	})
}

// newServer builds a tracker over the store open returns. It binds the
// configured listeners, or, with ho (a replica's term as leader), serves
// the connections ho hands it.
func newServer(cfg Config, ho *handoff, open func(s *Server) (store.Backend, error)) (*Server, error) {
	s := &Server{
		cfg:        cfg,
		log:        cfg.Logger,
		nodes:      make(map[string]*node),
		byKey:      make(map[string]map[string]*node),
		queues:     make(map[string]*queue),
		tickets:    make(map[string]*ticket),
		leases:     make(map[string]*lease),
		byToken:    make(map[string]*lease),
		byRequest:  make(map[idemKey]*lease),
		jobs:       make(map[string]*job),
		submitting: make(map[idemKey]chan struct{}),
		userConns:  make(map[*proto.Conn]struct{}),
		jobAvail:   make(chan struct{}),
		runDone:    make(chan struct{}),
	}
	s.initMetrics()
	s.tvm.init()
	s.creds.init()
	if err := os.MkdirAll(cfg.DataDir, 0o755); err != nil {
		return nil, fmt.Errorf("create tracker data dir: %w", err)
	}
	blobs, err := openBlobStore(context.Background(), cfg.Artifacts, cfg.DataDir)
	if err != nil {
		return nil, err
	}
	s.blobs = blobs
	if s.modules, err = blobs.sub("modules"); err != nil {
		return nil, err
	}
	st, err := open(s)
	if err != nil {
		return nil, fmt.Errorf("open tracker store: %w", err)
	}
	s.st = st
	if cfg.UsersFile != "" {
		s.users = &users{path: cfg.UsersFile}
		if _, err := s.users.load(); err != nil {
			st.Close()
			return nil, err
		}
	}
	if cfg.Token != "" {
		s.log.Warn("the shared fleet token (--token-file) admits any role and acts as administrator; give nodes join tokens (kiln token create --role device|compiler --ttl 1h) and users named tokens (see docs/security.md)")
	}
	if err := s.load(); err != nil {
		st.Close()
		return nil, fmt.Errorf("load tracker state: %w", err)
	}
	if ho != nil {
		s.ln = ho.kiln
		if ho.tvm != nil {
			s.tvmLn = ho.tvm
		}
	} else if err := s.listen(); err != nil {
		s.closeListeners()
		st.Close()
		return nil, err
	}
	scfg := proto.ServerConfig{
		Token:        cfg.Token,
		Roles:        []proto.Role{proto.RoleClient, proto.RoleDevice, proto.RoleCompiler},
		Kind:         proto.ListenerTracker,
		Logger:       s.log,
		OnDisconnect: s.disconnected,
	}
	if cfg.replicated() {
		// Followers forward their clients' connections: here they all
		// come from a follower's address, so one guesser must not turn
		// every client of that follower away.
		scfg.MaxAuthFailures = -1
	}
	if s.users != nil {
		scfg.Authenticate = s.authenticate
		scfg.OnConnect = s.connected
	}
	s.rpc = proto.NewServer(scfg)
	s.routes()
	return s, nil
}

func (s *Server) listen() error {
	if err := proto.CheckExposure("tracker", s.cfg.Listen, s.cfg.Token+s.cfg.UsersFile, s.cfg.TLS, "--insecure"); err != nil {
		if !s.cfg.Insecure {
			return err
		}
		s.log.Warn("INSECURE: the tracker accepts anyone who can reach it", "listen", s.cfg.Listen)
	}
	var err error
	if s.ln, err = net.Listen("tcp", s.cfg.Listen); err != nil {
		return fmt.Errorf("tracker listen %s: %w", s.cfg.Listen, err)
	}
	if s.cfg.TVMListen != "" {
		if s.tvmLn, err = net.Listen("tcp", s.cfg.TVMListen); err != nil {
			return fmt.Errorf("tracker tvm listen %s: %w", s.cfg.TVMListen, err)
		}
		if s.cfg.Token != "" {
			s.log.Warn("the TVM tracker protocol carries no token: its listener is unauthenticated", "addr", s.tvmLn.Addr().String())
		}
	}
	if s.cfg.MetricsListen != "" {
		if s.metricsLn, err = net.Listen("tcp", s.cfg.MetricsListen); err != nil {
			return fmt.Errorf("tracker metrics listen %s: %w", s.cfg.MetricsListen, err)
		}
	}
	return nil
}

func (s *Server) closeListeners() {
	for _, ln := range []net.Listener{s.ln, s.tvmLn, s.metricsLn} {
		if ln != nil {
			ln.Close()
		}
	}
}

// Addr returns the kiln protocol listener's address.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// TVMAddr returns the TVM protocol listener's address, "" when off.
func (s *Server) TVMAddr() string {
	if s.tvmLn == nil {
		return ""
	}
	return s.tvmLn.Addr().String()
}

// MetricsAddr returns the metrics listener's address, "" when off.
func (s *Server) MetricsAddr() string {
	if s.metricsLn == nil {
		return ""
	}
	return s.metricsLn.Addr().String()
}

// Run serves until ctx is cancelled (or Close is called, or a TVM STOP
// with the stop key arrives), then stops the parts in order: the
// listeners and their connections (waiting for running handlers), the
// expiry loop, and last the store, after flushing its queued writes. It
// returns nil after a clean stop. Run may be called once.
func (s *Server) Run(ctx context.Context) error {
	s.runMu.Lock()
	if s.running {
		s.runMu.Unlock()
		return errors.New("tracker: Run called after Close or a second time")
	}
	s.running = true
	ctx, cancel := context.WithCancel(ctx)
	s.runCancel = cancel
	s.runMu.Unlock()
	defer close(s.runDone)
	defer cancel()
	if s.rep != nil {
		err := s.rep.run(ctx)
		if serr := s.shutdown(); err == nil {
			err = serr
		}
		return err
	}

	s.log.Info("tracker serving", "addr", s.Addr(), "tvm", s.TVMAddr(), "metrics", s.MetricsAddr(), "data", s.cfg.DataDir)
	// The listeners and connections stop on serve, which ends only after
	// stopping is set: a connection the shutdown itself closes must not
	// mark its node lost or requeue its jobs (a restart restores them).
	serve, stopServing := context.WithCancel(context.WithoutCancel(ctx))
	defer stopServing()
	var (
		wg    sync.WaitGroup
		errMu sync.Mutex
		first error
	)
	fail := func(err error) {
		errMu.Lock()
		if first == nil {
			first = err
		}
		errMu.Unlock()
		cancel()
	}
	var ln net.Listener = s.ln
	if s.cfg.TLS != nil {
		ln = tlsListener(ln, s.cfg.TLS)
	}
	wg.Go(func() {
		if err := s.rpc.Serve(serve, ln); err != nil {
			fail(fmt.Errorf("tracker serve: %w", err))
		}
	})
	if s.tvmLn != nil {
		wg.Go(func() { s.serveTVM(serve) })
	}
	if s.metricsLn != nil {
		s.httpSrv = metricsrv.NewServer(s.metricsHandler())
		wg.Go(func() {
			if err := metricsrv.Serve(s.httpSrv, s.metricsLn); err != nil && !errors.Is(err, http.ErrServerClosed) {
				fail(fmt.Errorf("tracker metrics: %w", err))
			}
		})
		wg.Go(func() {
			<-serve.Done()
			sctx, c := context.WithTimeout(context.Background(), 5*time.Second)
			defer c()
			s.httpSrv.Shutdown(sctx)
		})
	}
	wg.Go(func() { s.expiryLoop(serve) })
	<-ctx.Done()
	s.log.Info("tracker stopping")
	s.mu.Lock()
	s.stopping = true
	s.mu.Unlock()
	stopServing()
	wg.Wait()
	err := s.shutdown()
	if first == nil && err != nil {
		first = err
	}
	s.log.Info("tracker stopped")
	return first
}

// Close stops the tracker: it cancels a running Run and waits for it, or,
// when Run was never called, closes the listeners and the store. It is
// idempotent.
func (s *Server) Close() error {
	s.runMu.Lock()
	running, cancel := s.running, s.runCancel
	if !running {
		s.running = true // a later Run fails
		close(s.runDone)
	}
	s.runMu.Unlock()
	if running {
		cancel()
		<-s.runDone
		return s.closeErr
	}
	return s.shutdown()
}

// shutdown closes what Run does not: listeners not yet closed and the store.
func (s *Server) shutdown() error {
	s.closeOnce.Do(func() {
		if s.rep != nil {
			s.closeListeners()
			s.closeErr = s.rep.close()
			return
		}
		s.rpc.Close()
		s.closeListeners()
		s.tvm.closeAll()
		s.mu.Lock()
		for _, t := range s.tickets {
			s.dropTicketLocked(t, fmt.Errorf("lease request %s: tracker is shutting down: %w", t.id, proto.ErrUnavailable))
		}
		s.mu.Unlock()
		s.closeErr = s.st.Close()
	})
	return s.closeErr
}

// handle registers a method whose arguments decode into A, behind the
// identity gate.
func handle[A any](s *Server, method string, fn func(ctx context.Context, c *proto.Conn, a A) (any, error)) {
	s.rpc.Handle(method, func(ctx context.Context, c *proto.Conn, raw msgpack.RawMessage) (any, error) {
		if err := gate(c, method); err != nil {
			return nil, err
		}
		var a A
		if len(raw) > 0 {
			if err := msgpack.Unmarshal(raw, &a); err != nil {
				return nil, fmt.Errorf("%s: decode arguments: %v: %w", method, err, proto.ErrBadRequest)
			}
		}
		return fn(ctx, c, a)
	})
}

// handleBulk registers a bulk method behind the identity gate.
func handleBulk(s *Server, method string, fn proto.BulkHandlerFunc) {
	s.rpc.HandleBulk(method, func(ctx context.Context, c *proto.Conn, in proto.Bulk) (proto.Bulk, error) {
		if err := gate(c, method); err != nil {
			return proto.Bulk{}, err
		}
		return fn(ctx, c, in)
	})
}

func (s *Server) routes() {
	handle(s, proto.MethodTrackerRegister, s.handleRegister)
	handle(s, proto.MethodTrackerHeartbeat, s.handleHeartbeat)
	handle(s, proto.MethodTrackerDeregister, s.handleDeregister)
	handle(s, proto.MethodTrackerReport, s.handleReport)
	handle(s, proto.MethodLeaseRequest, s.handleLeaseRequest)
	handle(s, proto.MethodLeaseWait, s.handleLeaseWait)
	handle(s, proto.MethodLeaseCancel, s.handleLeaseCancel)
	handle(s, proto.MethodLeaseRenew, s.handleLeaseRenew)
	handle(s, proto.MethodLeaseRelease, s.handleLeaseRelease)
	handle(s, proto.MethodLeaseVerify, s.handleLeaseVerify)
	handle(s, proto.MethodTrackerQuery, s.handleQuery)
	handle(s, proto.MethodBuildSubmit, s.handleBuildSubmit)
	handle(s, proto.MethodBuildStatus, s.handleBuildStatus)
	handle(s, proto.MethodBuildWait, s.handleBuildWait)
	handle(s, proto.MethodBuildCancel, s.handleBuildCancel)
	handle(s, proto.MethodBuildTake, s.handleBuildTake)
	handle(s, proto.MethodBuildProgress, s.handleBuildProgress)
	handle(s, proto.MethodBuildComplete, s.handleBuildComplete)
	handle(s, proto.MethodBuildFail, s.handleBuildFail)
	handle(s, proto.MethodTrackerJoin, s.handleJoin)
	handle(s, proto.MethodResultRecord, s.handleResultRecord)
	handle(s, proto.MethodResultList, s.handleResultList)
	handle(s, proto.MethodResultGet, s.handleResultGet)
	handleBulk(s, proto.BulkArtifactUpload, s.handleArtifactUpload)
	handleBulk(s, proto.BulkArtifactDownload, s.handleArtifactDownload)
	handleBulk(s, proto.BulkBuildSubmit, s.handleBuildSubmitStream)
	handleBulk(s, proto.BulkBuildModule, s.handleBuildModule)
}

// connected records a user's connection, so that revoking the user closes
// it.
func (s *Server) connected(ctx context.Context, c *proto.Conn) error {
	if c.User() != "" {
		s.mu.Lock()
		s.userConns[c] = struct{}{}
		s.mu.Unlock()
	}
	return nil
}

// disconnected drops what a connection owned: its queued lease requests
// (and leases granted to them but never delivered), the leases it holds
// on a single tracker, and the node it registered, which is marked lost.
func (s *Server) disconnected(c *proto.Conn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.userConns, c)
	for _, t := range s.tickets {
		if t.conn == c {
			s.dropTicketLocked(t, fmt.Errorf("lease request %s: client connection closed: %w", t.id, proto.ErrCancelled))
		}
	}
	s.orphanJobsLocked(c, time.Now())
	if !s.stopping && !s.cfg.replicated() { // see lease.holder
		for _, l := range s.leases {
			if l.holder == c {
				s.log.Info("lease released: its holder's connection closed", "lease", l.ID, "node", l.NodeID)
				s.releaseLocked(l)
			}
		}
	}
	if id, ok := c.Value(connNodeKey{}).(string); ok && !s.stopping {
		if n := s.nodes[id]; n != nil && n.conn == c {
			n.conn = nil
			s.markLostLocked(n, "connection closed", time.Now())
		}
	}
}

// expiryLoop runs the periodic checks until ctx ends.
func (s *Server) expiryLoop(ctx context.Context) {
	t := time.NewTicker(s.cfg.Tick)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			s.mu.Lock()
			if s.stopping {
				s.mu.Unlock()
				return
			}
			s.expireNodesLocked(now)
			s.expireLeasesLocked(now)
			s.expireTicketsLocked(now)
			s.expireJobsLocked(now)
			s.mu.Unlock()
			if s.users != nil {
				s.reloadUsers()
				s.expireCredentials(now)
			}
		}
	}
}

// randomID returns prefix followed by n random bytes in hex.
func randomID(prefix string, n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

// notify closes *ch and replaces it: a broadcast to everyone waiting on it.
func notify(ch *chan struct{}) {
	close(*ch)
	*ch = make(chan struct{})
}
