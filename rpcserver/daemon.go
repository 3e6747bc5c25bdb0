package rpcserver

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/kiln-ml/kiln/internal/metrics"
	"github.com/kiln-ml/kiln/rpcserver/proto"
)

// Defaults of Config.
const (
	DefaultListen         = ":9090"
	DefaultSessionTimeout = 30 * time.Minute
	DefaultDrainTimeout   = 10 * time.Second
	// DefaultSessionQuota bounds the files of one session (16 GiB) where
	// the free space of the session directory cannot be read.
	DefaultSessionQuota = 16 << 30
)

// endGrace is how long the daemon keeps a session's connection open after
// the session ended (expired, crashed), so that calls in flight and the
// next call hear why; then it closes the connection.
const endGrace = 2 * time.Second

// Tracker plugs a daemon into a tracker. client.Registrar implements it;
// the CLI builds one and passes it in Config.Tracker (rpcserver must not
// import client).
type Tracker interface {
	// VerifyLease checks that token is a live lease on this daemon.
	VerifyLease(ctx context.Context, token string) (proto.LeaseInfo, error)
	// SetActiveLeases tells the tracker which leases the daemon serves
	// sessions under now (none when idle); they travel with the next
	// heartbeat.
	SetActiveLeases(ids []string)
}

// FailureReporter is implemented by a Tracker that can report a device
// failure (a crashed worker) to the tracker.
type FailureReporter interface {
	ReportFailure(ctx context.Context, message string) error
}

// SessionCounter is implemented by a Tracker that tells the tracker how
// many sessions the daemon serves under no lease (with
// AllowWithoutLease), which take the device's capacity as leases do.
type SessionCounter interface {
	SetUnleasedSessions(n int)
}

// LeaseWatcher is implemented by a Tracker that learns when a lease ends
// before its session does: the daemon then ends that session.
type LeaseWatcher interface {
	WatchLeases(fn func(id string))
}

// Runner is implemented by a Tracker with a life of its own (registration
// and heartbeats): the daemon runs it for as long as it runs.
type Runner interface {
	Run(ctx context.Context) error
}

// Config configures a Daemon. The zero value serves one exclusive session
// at a time on DefaultListen without a token.
type Config struct {
	// Listener, when set, is served instead of listening on Listen: the
	// connections a kiln proxy carries to a daemon behind NAT.
	Listener net.Listener
	// Listen is the address to listen on (DefaultListen when empty;
	// "127.0.0.1:0" in tests).
	Listen string
	// Key is the device key the daemon registers under.
	Key string
	// Token, when not empty, is the token every client's hello must carry.
	Token string
	// TLS, when set, serves TLS (see proto.TLSConfig.Server).
	TLS *tls.Config
	// SessionTimeout bounds a session's life from its connection
	// (DefaultSessionTimeout when 0); a lease's session timeout overrides it.
	SessionTimeout time.Duration
	// MaxSessions is the number of sessions served at once (1 when 0: one
	// exclusive session per device); later clients are refused with ErrBusy.
	MaxSessions int
	// Dir holds the session directories (a kiln-rpcserver directory in the
	// system's temporary directory when empty).
	Dir string
	// SessionQuota bounds the bytes of one session's files (when 0, a
	// quarter of the free space of Dir at start; none when negative).
	SessionQuota int64
	// UploadCacheBytes bounds the uploads the daemon keeps by content for
	// later sessions (proto.FileLinkCached); 0 keeps none.
	UploadCacheBytes int64
	// Worker says how to start worker processes.
	Worker WorkerSpec
	// Tracker, when set, verifies the lease token of every session.
	Tracker Tracker
	// AllowWithoutLease lets clients without a lease token open sessions
	// when Tracker is set.
	AllowWithoutLease bool
	// TokenIsFleet says Token is the tracker's fleet token (the daemon
	// registers with it): an all-role secret for bootstrap, which then
	// opens no session here unless AcceptFleetToken; clients connect with
	// their lease tokens instead.
	TokenIsFleet bool
	// AcceptFleetToken lets hellos carrying the fleet token open sessions
	// although TokenIsFleet (`kiln rpcserver --accept-fleet-token`); the
	// daemon then warns at start.
	AcceptFleetToken bool
	// DrainTimeout bounds how long Run waits for open sessions to end once
	// its context is cancelled, before it cuts them (DefaultDrainTimeout when 0).
	DrainTimeout time.Duration
	// MetricsListen, when set, serves /metrics on this HTTP address.
	MetricsListen string
	// Version is the kiln version the daemon reports.
	Version string
	// MaxFrameSize bounds one request or response frame (proto's default when 0).
	MaxFrameSize int
	// Insecure lets the daemon listen beyond loopback with neither a
	// token nor mutual TLS (New refuses that otherwise); it then warns.
	Insecure bool
	// InsecureShared lets MaxSessions exceed 1 when sessions are not
	// sandboxed (New refuses that otherwise): their workers then run as
	// the daemon's user, in its namespaces, so serving several tenants at
	// once is the operator's explicit choice; the daemon then warns.
	InsecureShared bool
	// Sandbox is how workers are confined: SandboxAuto (when empty),
	// SandboxBwrap or SandboxOff.
	Sandbox string
	// WorkerUIDs, when the daemon runs as root, are the uids sandboxed
	// workers run as, one per session at a time (at least MaxSessions).
	// A root daemon given none takes MaxSessions uids from
	// sandbox.AutoUIDBase up: its workers never run as root.
	WorkerUIDs []int
	// MaxSessionMemory caps the memory of all of a session's processes
	// together in bytes, with a cgroup's memory limit (New fails where the
	// daemon can make no cgroup); 0: no cap.
	MaxSessionMemory int64
	// MaxSessionProcs caps a session's processes, all counted (a cgroup's
	// pids limit, else RLIMIT_NPROC of the session's own worker uid; New
	// fails with neither); 0: DefaultMaxSessionProcs when sandboxed, none
	// otherwise (and none with neither a cgroup nor a worker uid);
	// negative: none.
	MaxSessionProcs int
	// Plugins are shared objects of kiln's packed ABI (each exports
	// kiln_module_metadata, as every kiln module does) whose functions
	// every session serves as globals (`kiln rpcserver --plugin`): the
	// board operator's extensions of the registry. New opens them; a
	// name that clashes with a built-in global fails the session's start.
	Plugins []string
	// Logger receives the daemon's logs (slog.Default() when nil).
	Logger *slog.Logger
}

// Daemon is a device daemon: it accepts client sessions and serves each in
// a worker process. Create it with New, run it with Run.
type Daemon struct {
	cfg Config
	log *slog.Logger
	ln  net.Listener
	mln net.Listener // the metrics listener (nil without MetricsListen)
	srv *proto.Server
	reg *metrics.Registry
	m   daemonMetrics
	iso *isolation // how workers are confined
	// gpus are the GPUs sessions get one each (see sessionGPUs); nil
	// with fewer than two.
	gpus []string
	// plugins are Config.Plugins, open read-only for the workers.
	plugins []*os.File

	wg sync.WaitGroup // worker waiters, stderr readers, download pipes

	mu       sync.Mutex
	sessions map[*session]bool // sessions holding a slot
	draining bool
	idle     chan struct{} // closed when the last slot is released while draining
	nextID   atomic.Uint64
	ran      atomic.Bool

	cache *uploadCache // nil when uploads are not kept

	tmu     sync.Mutex
	tickets map[string]uploadTicket // upload tickets waiting for their connections
	calls   map[string]*session     // call tickets waiting for their connections
}

// daemonMetrics are the daemon's Prometheus metrics.
type daemonMetrics struct {
	active   *metrics.Gauge
	total    *metrics.Counter
	refused  *metrics.Counter
	ended    *metrics.Counter
	crashes  *metrics.Counter
	calls    *metrics.Counter
	inflight *metrics.Gauge
	latency  *metrics.Histogram
	bulkByte *metrics.Counter
	// cacheLinked counts the bytes linked from the upload cache in place
	// of an upload.
	cacheLinked *metrics.Counter
	// users and usersActive count sessions opened under a lease by the
	// lease's user.
	users       *metrics.Counter
	usersActive *metrics.Gauge
}

// New checks cfg and binds the listener; Addr is valid at once. Run
// serves it and closes it when it returns.
func New(cfg Config) (*Daemon, error) {
	if cfg.Listen == "" {
		cfg.Listen = DefaultListen
	}
	if cfg.SessionTimeout <= 0 {
		cfg.SessionTimeout = DefaultSessionTimeout
	}
	if cfg.MaxSessions <= 0 {
		cfg.MaxSessions = 1
	}
	if cfg.DrainTimeout <= 0 {
		cfg.DrainTimeout = DefaultDrainTimeout
	}
	if cfg.Dir == "" {
		cfg.Dir = filepath.Join(os.TempDir(), "kiln-rpcserver")
	}
	// Workers run in their session directories: a relative path would
	// name another place there.
	dir, err := filepath.Abs(cfg.Dir)
	if err != nil {
		return nil, fmt.Errorf("rpcserver: session directory: %w", err)
	}
	cfg.Dir = dir
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("rpcserver: session directory: %w", err)
	}
	if err := checkSessionRoot(cfg.Dir); err != nil {
		return nil, err
	}
	if len(cfg.WorkerUIDs) > 0 || (os.Geteuid() == 0 && cfg.Sandbox != SandboxOff) {
		// Workers of the pool (a root daemon's sandboxed workers always
		// have uids of their own) must pass through to their own session
		// directories (0700, theirs); they cannot list the root.
		if err := os.Chmod(cfg.Dir, 0o711); err != nil {
			return nil, fmt.Errorf("rpcserver: session directory: %w", err)
		}
	}
	explicitQuota := cfg.SessionQuota > 0
	switch {
	case cfg.SessionQuota == 0:
		cfg.SessionQuota = defaultQuota(cfg.Dir)
	case cfg.SessionQuota < 0:
		cfg.SessionQuota = 0
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	iso, err := newIsolation(cfg, explicitQuota, func(msg string, args ...any) { log.Info(msg, args...) })
	if err != nil {
		return nil, err
	}
	if len(iso.uids) == 0 {
		// No worker uids after all (the sandbox does not work here): the
		// session root stays private.
		if err := os.Chmod(cfg.Dir, 0o700); err != nil {
			iso.close()
			return nil, fmt.Errorf("rpcserver: session directory: %w", err)
		}
	}
	sandboxed := iso.bwrap != ""
	if sandboxed {
		log.Info("sessions are sandboxed with bubblewrap: each worker in its own user, PID, mount, IPC and network namespaces, with only its session directory writable",
			"worker_uids", len(iso.uids), "max_session_memory", iso.memory, "max_session_procs", iso.procs, "caps_by", iso.capsBy(),
			"session_write_cap", iso.quota)
	} else {
		log.Warn("sessions are not sandboxed from each other: workers run as the daemon's user, in its PID, IPC and network namespaces", "why", iso.why,
			"max_session_memory", iso.memory, "max_session_procs", iso.procs, "caps_by", iso.capsBy())
		switch {
		case iso.capMount != "":
			log.Info("each unsandboxed session's directory is a tmpfs of session_write_cap bytes in its worker's own mount namespace (the uploads bound read-only): kernels' writes into it stop there with ENOSPC; their writes elsewhere are not capped",
				"session_write_cap", iso.quota, "max_session_bytes", cfg.SessionQuota)
		case cfg.SessionQuota > 0:
			log.Warn("kernels' writes into session directories are not capped: --max-session-bytes caps only uploads and the worker's copies of modules", "why", iso.capWhy, "max_session_bytes", cfg.SessionQuota)
		}
	}
	if cfg.MaxSessions > 1 && !sandboxed {
		if !cfg.InsecureShared {
			iso.close()
			return nil, fmt.Errorf("rpcserver: --max-sessions %d: this daemon cannot sandbox sessions from each other (%s), so it serves one session at a time; give --insecure-shared to serve several anyway", cfg.MaxSessions, iso.why)
		}
		log.Warn("INSECURE: sessions are not sandboxed from each other; with --insecure-shared, concurrent sessions can read each other's files and signal each other's workers", "max_sessions", cfg.MaxSessions)
	}
	exposed := proto.CheckExposure("rpcserver", cfg.Listen, cfg.Token, cfg.TLS, "--insecure")
	if err := exposed; err != nil {
		if !cfg.Insecure {
			return nil, err
		}
		log.Warn("INSECURE: the device daemon accepts anyone who can reach it, and will run the native code they upload", "listen", cfg.Listen)
	}
	if cfg.TokenIsFleet {
		if cfg.AllowWithoutLease && !cfg.AcceptFleetToken {
			iso.close()
			return nil, errors.New("rpcserver: --allow-without-lease: a session without a lease is admitted by the fleet token, which this daemon refuses for sessions; give --accept-fleet-token too, or a board token of its own in --token-file (and the fleet token in --tracker-token-file)")
		}
		if cfg.AcceptFleetToken {
			log.Warn("the fleet token opens sessions on this device (--accept-fleet-token): anyone holding it, which every node's bootstrap may have, runs code here without a lease")
		} else {
			log.Warn("this daemon registers with the fleet token, an all-role secret meant for bootstrap: join with a join token and --credential-file instead; sessions here need a lease token, the fleet token opens none")
		}
	}
	plugins, err := openPlugins(cfg.Plugins)
	if err != nil {
		iso.close()
		return nil, err
	}
	ln := cfg.Listener
	if ln == nil {
		ln, err = net.Listen("tcp", cfg.Listen)
	}
	if err != nil {
		iso.close()
		closePlugins(plugins)
		return nil, fmt.Errorf("rpcserver: listen: %w", err)
	}
	var mln net.Listener
	if cfg.MetricsListen != "" {
		if mln, err = net.Listen("tcp", cfg.MetricsListen); err != nil {
			ln.Close()
			iso.close()
			closePlugins(plugins)
			return nil, fmt.Errorf("rpcserver: metrics listen %s: %w", cfg.MetricsListen, err)
		}
	}
	if cfg.TLS != nil {
		ln = tls.NewListener(ln, cfg.TLS)
	}
	d := &Daemon{cfg: cfg, log: log.With("component", "rpcserver"), ln: ln, mln: mln, reg: metrics.NewRegistry(), iso: iso,
		sessions: map[*session]bool{}, tickets: map[string]uploadTicket{}, calls: map[string]*session{}, gpus: sessionGPUs(), plugins: plugins}
	d.m = daemonMetrics{
		active:      d.reg.Gauge("kiln_rpcserver_sessions_active", "Sessions open now."),
		total:       d.reg.Counter("kiln_rpcserver_sessions_total", "Sessions admitted."),
		refused:     d.reg.Counter("kiln_rpcserver_sessions_refused_total", "Connections refused, by reason.", "reason"),
		ended:       d.reg.Counter("kiln_rpcserver_sessions_ended_total", "Sessions ended, by how.", "how"),
		crashes:     d.reg.Counter("kiln_rpcserver_worker_crashes_total", "Worker processes that crashed or were killed."),
		calls:       d.reg.Counter("kiln_rpcserver_calls_total", "Requests served, by method and result code.", "method", "code"),
		inflight:    d.reg.Gauge("kiln_rpcserver_worker_calls_in_flight", "Requests running in session workers, those on clients' call connections included."),
		latency:     d.reg.Histogram("kiln_rpcserver_call_duration_seconds", "Time to serve a request, by method.", nil, "method"),
		bulkByte:    d.reg.Counter("kiln_rpcserver_bulk_bytes_total", "Bytes received in bulk transfers, by method.", "method"),
		cacheLinked: d.reg.Counter("kiln_rpcserver_upload_cache_linked_bytes_total", "Bytes of files linked from the upload cache into sessions in place of an upload."),
	}
	if d.cache, err = newUploadCache(cfg.Dir, cfg.UploadCacheBytes); err != nil {
		ln.Close()
		if mln != nil {
			mln.Close()
		}
		iso.close()
		closePlugins(plugins)
		return nil, fmt.Errorf("rpcserver: %w", err)
	}
	d.reg.Flag("kiln_rpcserver_sandboxed", "1 when sessions are sandboxed from each other (bubblewrap); 0: workers run as the daemon's user, in its namespaces.", sandboxed)
	d.reg.Flag("kiln_rpcserver_insecure_shared", "1 when the daemon serves several unsandboxed sessions at once (--insecure-shared).", cfg.MaxSessions > 1 && !sandboxed)
	d.reg.Gauge("kiln_rpcserver_session_write_cap_bytes", "Bytes at which a kernel's writes into its session's directory stop (the size of its tmpfs); 0: they are not capped.").Set(float64(d.iso.writeCapped()))
	d.reg.Flag("kiln_rpcserver_insecure", "1 when the daemon was started with --insecure and listens beyond loopback with neither a token nor mutual TLS.", exposed != nil)
	d.m.active.Set(0)
	d.m.inflight.Set(0)
	d.m.users = d.reg.Counter("kiln_rpcserver_sessions_by_user_total", "Sessions opened under a tracker lease, by the lease's user (\"\" for a lease without a named user).", "user")
	d.m.usersActive = d.reg.Gauge("kiln_rpcserver_sessions_active_by_user", "Sessions open now under a tracker lease, by the lease's user.", "user")
	d.srv = proto.NewServer(proto.ServerConfig{
		Authenticate: d.authenticate,
		Roles:        []proto.Role{proto.RoleClient, proto.RoleBulk, proto.RoleCall},
		Kind:         proto.ListenerDevice,
		MaxFrameSize: cfg.MaxFrameSize,
		Logger:       d.log,
		OnConnect:    d.admit,
		OnDisconnect: d.disconnect,
		OnRaw:        d.serveRaw,
	})
	d.registerHandlers()
	return d, nil
}

// Capacity is what the daemon advertises to a tracker when it registers:
// how many sessions it serves at once, and whether they are sandboxed from
// each other (the tracker grants concurrent leases only on a sandboxed
// device).
func (d *Daemon) Capacity() (maxSessions int, sandboxed bool) {
	return d.cfg.MaxSessions, d.iso.bwrap != ""
}

// activeLeases returns the leases the open sessions serve.
func (d *Daemon) activeLeases() []string {
	var ids []string
	for _, s := range d.openSessions() {
		s.mu.Lock()
		if s.lease != "" && s.state != stateEnded {
			ids = append(ids, s.lease)
		}
		s.mu.Unlock()
	}
	slices.Sort(ids)
	return ids
}

// SetTracker attaches the tracker (Config.Tracker) after New, for callers
// that need the bound address (Addr) to register with it. Call it before
// Run, never during.
func (d *Daemon) SetTracker(t Tracker) { d.cfg.Tracker = t }

// Addr is the address the daemon listens on.
func (d *Daemon) Addr() net.Addr { return d.ln.Addr() }

// MetricsAddr is the address of the metrics listener ("" without
// Config.MetricsListen).
func (d *Daemon) MetricsAddr() string {
	if d.mln == nil {
		return ""
	}
	return d.mln.Addr().String()
}

// MetricsHandler serves the daemon's metrics in Prometheus's text format.
func (d *Daemon) MetricsHandler() http.Handler {
	h := d.reg.Handler()
	return http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		d.refreshMetrics()
		h.ServeHTTP(rw, r)
	})
}

// openSessions returns the sessions holding a slot now.
func (d *Daemon) openSessions() []*session {
	d.mu.Lock()
	defer d.mu.Unlock()
	open := make([]*session, 0, len(d.sessions))
	for s := range d.sessions {
		open = append(open, s)
	}
	return open
}

// postPeers writes on each open session's call board how many other
// sessions the daemon serves, which their time evaluators report.
func (d *Daemon) postPeers() {
	open := d.openSessions()
	for _, s := range open {
		s.mu.Lock()
		w := s.worker
		s.mu.Unlock()
		if w != nil {
			w.board.setPeers(len(open) - 1)
		}
	}
}

// refreshMetrics reads the sessions' call boards: calls in flight, and
// the calls their workers served on the clients' call connections.
func (d *Daemon) refreshMetrics() {
	n := 0
	for _, s := range d.openSessions() {
		n += s.inFlight()
		s.mu.Lock()
		w := s.worker
		s.mu.Unlock()
		s.syncCounts(w)
	}
	d.m.inflight.Set(float64(n))
}

// Run serves until ctx is cancelled, then stops in order: it refuses new
// sessions, lets open ones end for up to DrainTimeout, cuts the rest (their
// workers are stopped and their directories removed), and returns nil.
// Run may be called once.
func (d *Daemon) Run(ctx context.Context) error {
	if d.ran.Swap(true) {
		return errors.New("rpcserver: Run called twice")
	}
	d.log.Info("device daemon listening", "addr", d.ln.Addr().String(), "key", d.cfg.Key,
		"max_sessions", d.cfg.MaxSessions, "session_timeout", d.cfg.SessionTimeout, "tls", d.cfg.TLS != nil, "max_session_bytes", d.cfg.SessionQuota)
	serveCtx, cut := context.WithCancel(context.WithoutCancel(ctx))
	defer cut()

	var parts sync.WaitGroup
	var serveErr error
	parts.Go(func() { serveErr = d.srv.Serve(serveCtx, d.ln) })
	if w, ok := d.cfg.Tracker.(LeaseWatcher); ok {
		w.WatchLeases(d.leaseEnded)
	}
	if r, ok := d.cfg.Tracker.(Runner); ok {
		parts.Go(func() {
			if err := r.Run(serveCtx); err != nil && serveCtx.Err() == nil {
				d.log.Error("tracker registration stopped", "err", err)
			}
		})
	}
	var hs *http.Server
	if d.mln != nil {
		hs = metrics.NewServer(d.HTTPHandler())
		parts.Go(func() {
			if err := metrics.Serve(hs, d.mln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				d.log.Error("metrics listener", "err", err)
			}
		})
	}

	select {
	case <-ctx.Done():
	case <-serveCtx.Done():
	}
	d.drain()
	cut()
	if hs != nil {
		sctx, cancel := context.WithTimeout(context.Background(), time.Second)
		hs.Shutdown(sctx)
		cancel()
	}
	parts.Wait()
	d.wg.Wait()
	d.iso.close()
	closePlugins(d.plugins)
	if err := d.cache.close(); err != nil {
		d.log.Warn("remove the upload cache", "err", err)
	}
	d.log.Info("device daemon stopped")
	if serveErr != nil && ctx.Err() == nil {
		return fmt.Errorf("rpcserver: %w", serveErr)
	}
	return nil
}

// drain refuses new sessions and waits up to DrainTimeout for open ones.
func (d *Daemon) drain() {
	d.mu.Lock()
	d.draining = true
	n := len(d.sessions)
	var idle chan struct{}
	if n > 0 {
		d.idle = make(chan struct{})
		idle = d.idle
	}
	d.mu.Unlock()
	if idle == nil {
		return
	}
	d.log.Info("draining sessions", "open", n, "timeout", d.cfg.DrainTimeout)
	t := time.NewTimer(d.cfg.DrainTimeout)
	defer t.Stop()
	select {
	case <-idle:
	case <-t.C:
		d.log.Warn("drain timeout: cutting open sessions")
	}
}

// sessionKey is the proto.Conn value key of a connection's session.
type sessionKey struct{}

// admit runs at a client's hello: it refuses clients while the daemon
// drains. The device's slot is taken later, by session.open, once the
// client's lease (if the device is leased) has been verified: a client
// with the token but no lease cannot keep the lease's holder out.
func (d *Daemon) admit(_ context.Context, c *proto.Conn) error {
	if c.Role().Raw() {
		return nil // an upload or call connection of a session that holds its slot already
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.draining {
		d.m.refused.Inc("shutting_down")
		return fmt.Errorf("device daemon is shutting down: %w", proto.ErrUnavailable)
	}
	s := newSession(d, c, fmt.Sprintf("s%d", d.nextID.Add(1)))
	if tok := c.Credential(); tok != "" && d.cfg.Token != "" && !proto.TokenEqual(tok, d.cfg.Token) {
		s.helloLease = tok // admitted by its lease token (authenticate)
	}
	c.SetValue(sessionKey{}, s)
	s.log.Debug("connection admitted")
	return nil
}

// take gives s one of the device's session slots, under lease (its id;
// "" for a session without one), or refuses it with ErrBusy. A lease holds
// one session at a time: the tracker counts a multi-session board's
// sessions by the leases it granted there, so a second session under one
// lease would take a slot that the tracker grants to someone else.
func (d *Daemon) take(s *session, lease string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.draining {
		d.m.refused.Inc("shutting_down")
		return fmt.Errorf("device daemon is shutting down: %w", proto.ErrUnavailable)
	}
	if lease != "" {
		for o := range d.sessions {
			o.mu.Lock()
			same := o.lease == lease && o.state != stateEnded
			o.mu.Unlock()
			if same {
				d.m.refused.Inc("lease_in_use")
				return fmt.Errorf("lease %s already has a session on this device (session %s): a lease holds one session at a time; close that one first or ask the tracker for another lease: %w", lease, o.id, proto.ErrBusy)
			}
		}
		s.mu.Lock()
		s.lease = lease
		s.mu.Unlock()
	}
	if len(d.sessions) >= d.cfg.MaxSessions {
		d.m.refused.Inc("busy")
		var holder *session
		for s := range d.sessions {
			if holder == nil || s.started.Before(holder.started) {
				holder = s
			}
		}
		what := "an exclusive session"
		if d.cfg.MaxSessions > 1 {
			what = fmt.Sprintf("%d sessions (its limit)", len(d.sessions))
		}
		key := d.cfg.Key
		if key == "" {
			key = d.ln.Addr().String()
		}
		// Who holds the device is the holder's business: the error says
		// since when, not from where.
		return fmt.Errorf("device %s is busy: it is in %s (session %s since %s); try again later or ask the tracker for another device: %w",
			key, what, holder.id, holder.started.Format(time.RFC3339), proto.ErrBusy)
	}
	s.gpu = d.pickGPU()
	d.sessions[s] = true
	s.unleased = lease == "" && d.cfg.Tracker != nil
	if s.unleased {
		d.countUnleasedLocked()
	}
	d.m.total.Inc()
	d.m.active.Set(float64(len(d.sessions)))
	if s.user != "" {
		s.log.Info("session admitted", "timeout", d.cfg.SessionTimeout, "user", s.user)
	} else {
		s.log.Info("session admitted", "timeout", d.cfg.SessionTimeout)
	}
	return nil
}

// countUnleasedLocked tells the tracker how many sessions hold a slot
// under no lease (d.mu held).
func (d *Daemon) countUnleasedLocked() {
	sc, ok := d.cfg.Tracker.(SessionCounter)
	if !ok {
		return
	}
	n := 0
	for o := range d.sessions {
		if o.unleased {
			n++
		}
	}
	sc.SetUnleasedSessions(n)
}

// release gives s's slot back (idempotent).
func (d *Daemon) release(s *session) {
	defer d.postPeers()
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.sessions[s] {
		return
	}
	delete(d.sessions, s)
	if s.unleased {
		d.countUnleasedLocked()
	}
	d.m.active.Set(float64(len(d.sessions)))
	if len(d.sessions) == 0 && d.idle != nil {
		close(d.idle)
		d.idle = nil
	}
}

// disconnect runs once a client's connection has ended.
func (d *Daemon) disconnect(c *proto.Conn) {
	if s, ok := c.Value(sessionKey{}).(*session); ok {
		s.close()
	}
}

// sessionOf returns the connection's session.
func sessionOf(c *proto.Conn) *session {
	s, _ := c.Value(sessionKey{}).(*session)
	return s
}

// defaultQuota is a session's default disk quota: a quarter of the space
// free in dir now, so that one session cannot fill the disk.
func defaultQuota(dir string) int64 {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil || st.Bavail == 0 {
		return DefaultSessionQuota
	}
	return int64(st.Bavail) * int64(st.Bsize) / 4
}

// checkSessionRoot refuses a session directory that another user owns or
// that is a symbolic link: whoever controls it could read or replace the
// sessions' files and the libraries workers load. A directory of the
// daemon's own that others may enter is made private (0700).
func checkSessionRoot(dir string) error {
	fi, err := os.Lstat(dir)
	if err != nil {
		return fmt.Errorf("rpcserver: session directory: %w", err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("rpcserver: session directory %q is not a directory (a symbolic link is refused too); give --dir a directory of the daemon's own", dir)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && int(st.Uid) != os.Geteuid() {
		return fmt.Errorf("rpcserver: session directory %q belongs to user %d, not to the daemon's user %d; give --dir a directory of the daemon's own", dir, st.Uid, os.Geteuid())
	}
	if fi.Mode().Perm()&0o077 != 0 {
		if err := os.Chmod(dir, 0o700); err != nil {
			return fmt.Errorf("rpcserver: make session directory %q private: %w", dir, err)
		}
	}
	return nil
}

// leaseEnded ends the session served under lease id, which the tracker
// says was released or expired: its worker is killed and the device freed
// for the lease's next holder.
func (d *Daemon) leaseEnded(id string) {
	d.mu.Lock()
	var held *session
	for s := range d.sessions {
		s.mu.Lock()
		if s.lease == id {
			held = s
		}
		s.mu.Unlock()
	}
	d.mu.Unlock()
	if held != nil {
		held.leaseGone()
	}
}
