package proto

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"runtime/debug"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/yamux"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/kiln-ml/kiln/internal/refusal"
)

// DefaultMaxInFlight bounds the requests one connection may have running at
// once; the listener stops reading that connection's frames while it is at
// the bound.
const DefaultMaxInFlight = 512

// DefaultMaxBulkSize bounds one bulk upload: 16 GiB.
const DefaultMaxBulkSize = 16 << 30

// maxBulkHeader bounds the frame that opens a bulk stream.
const maxBulkHeader = 64 << 10

// HandlerFunc serves one method. ctx ends when the request's deadline passes,
// when the connection drops or when the server stops. The result is encoded
// with msgpack; an error is sent as a WireError whose code is the first
// sentinel the error wraps (ErrInternal when none).
type HandlerFunc func(ctx context.Context, c *Conn, args msgpack.RawMessage) (any, error)

// Bulk is the raw-byte part of a bulk transfer: Size bytes read from Body.
type Bulk struct {
	// Name says what the bytes are (a file name, a tensor handle).
	Name string
	// Size is the exact number of bytes Body yields.
	Size int64
	// Body yields the bytes; nil when Size is 0. A Body that is an
	// io.Closer is closed once sent.
	Body io.Reader
}

// BulkHandlerFunc serves one bulk method. in.Body reads the uploaded bytes
// straight from the stream; bytes the handler leaves unread are discarded.
// The returned Bulk is sent back (Size 0 and a nil Body for none).
type BulkHandlerFunc func(ctx context.Context, c *Conn, in Bulk) (Bulk, error)

// ServerConfig configures a Server. The zero value serves every role without
// a token, with the defaults below.
type ServerConfig struct {
	// Token, when not empty, is the token every hello must carry.
	Token string
	// Authenticate, when set, replaces the Token check: it gets the
	// hello's token and role and returns the peer's user name (Conn.User),
	// or an error. An error wrapping ErrUnauthorized is answered as a wrong
	// token; any other refuses the connection with its message (a token
	// issued for another role).
	Authenticate func(token string, role Role) (user string, err error)
	// Roles lists the roles this listener serves; empty means all.
	Roles []Role
	// Kind names what the listener is (ListenerTracker, ListenerDevice) in the
	// message of every accepted hello's reply, so that a dialer that
	// meant to reach another kind can say so (DialOptions.Expect).
	Kind string
	// HandshakeTimeout bounds the hello and the opening of the control
	// stream (DefaultHandshakeTimeout when 0).
	HandshakeTimeout time.Duration
	// MaxFrameSize bounds one request or response frame (DefaultMaxFrameSize when 0).
	MaxFrameSize int
	// MaxBulkSize bounds one bulk upload (DefaultMaxBulkSize when 0).
	MaxBulkSize int64
	// MaxInFlight bounds the concurrent requests of one connection
	// (DefaultMaxInFlight when 0).
	MaxInFlight int
	// KeepAlive is the yamux ping interval (DefaultKeepAlive when 0, off when negative).
	KeepAlive time.Duration
	// Logger receives the server's logs (slog.Default() when nil).
	Logger *slog.Logger
	// MaxAuthFailures is how many hellos with a wrong token one peer (an
	// IP address) may send in refusal.DefaultInterval; past it the peer's
	// hellos are refused unchecked, saying so, until the interval ends
	// (refusal.DefaultBurst when 0; no limit when negative: a listener
	// whose peers arrive through a proxy, all from its address).
	MaxAuthFailures int
	// OnConnect, when set, runs once a hello has passed the token and role
	// checks, before the reply: an error refuses the connection, and the
	// dialer's Dial fails with an error that wraps the same sentinel (a
	// device daemon that is busy answers ErrBusy). It is where a daemon
	// attaches state with Conn.SetValue; it runs under the handshake
	// deadline, so it should be quick.
	OnConnect func(ctx context.Context, c *Conn) error
	// OnDisconnect, when set, runs once a connection that OnConnect admitted
	// has ended and every handler it started has returned; it is where that
	// state is cleaned up.
	OnDisconnect func(c *Conn)
	// OnRaw, when set, serves a RoleBulk or RoleCall connection after its
	// hello: the connection is handed over as it is, with no multiplexer,
	// and closed when OnRaw returns (a descriptor passed on to another
	// process stays open there). Without it those roles are refused.
	OnRaw func(ctx context.Context, c *Conn, nc net.Conn) error
}

// Server is the listening end of the kiln protocol: it checks each
// connection's hello and dispatches its requests to handlers, concurrently.
type Server struct {
	cfg ServerConfig
	log *slog.Logger

	hmu      sync.RWMutex
	handlers map[string]HandlerFunc
	bulk     map[string]BulkHandlerFunc

	ctx    context.Context // cancelled by Close
	cancel context.CancelFunc

	// fails turns away peers that keep sending wrong tokens (nil: no
	// limit); refused logs wrong-token hellos, one line per interval.
	fails   *refusal.Limiter
	refused refusal.Log
}

// NewServer returns a Server with cfg; add methods with Handle and HandleBulk.
func NewServer(cfg ServerConfig) *Server {
	if cfg.HandshakeTimeout <= 0 {
		cfg.HandshakeTimeout = DefaultHandshakeTimeout
	}
	if cfg.MaxFrameSize <= 0 {
		cfg.MaxFrameSize = DefaultMaxFrameSize
	}
	if cfg.MaxBulkSize <= 0 {
		cfg.MaxBulkSize = DefaultMaxBulkSize
	}
	if cfg.MaxInFlight <= 0 {
		cfg.MaxInFlight = DefaultMaxInFlight
	}
	if cfg.KeepAlive == 0 {
		cfg.KeepAlive = DefaultKeepAlive
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Server{
		cfg:      cfg,
		log:      log,
		handlers: make(map[string]HandlerFunc),
		bulk:     make(map[string]BulkHandlerFunc),
		ctx:      ctx,
		cancel:   cancel,
	}
	if cfg.MaxAuthFailures >= 0 {
		s.fails = &refusal.Limiter{Burst: cfg.MaxAuthFailures}
	}
	return s
}

// Handle registers fn for method, replacing any earlier handler.
func (s *Server) Handle(method string, fn HandlerFunc) {
	s.hmu.Lock()
	defer s.hmu.Unlock()
	s.handlers[method] = fn
}

// HandleBulk registers fn for the bulk method, replacing any earlier handler.
func (s *Server) HandleBulk(method string, fn BulkHandlerFunc) {
	s.hmu.Lock()
	defer s.hmu.Unlock()
	s.bulk[method] = fn
}

// Close stops every Serve and ServeConn of s and refuses later ones. It does
// not wait: each Serve returns once its connections have ended. Close is
// idempotent and always returns nil.
func (s *Server) Close() error {
	s.cancel()
	return nil
}

// Serve accepts connections on ln and serves each until ctx is cancelled or
// Close is called; then it closes ln, ends every connection, waits for every
// goroutine it started (handlers included) and returns nil. It returns an
// error when ln fails for another reason.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	if s.ctx.Err() != nil {
		ln.Close()
		return fmt.Errorf("serve %s: server closed", ln.Addr())
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(s.ctx, cancel)
	defer stop()

	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() {
		<-ctx.Done()
		ln.Close()
	})
	var backoff time.Duration
	for {
		nc, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if errors.Is(err, net.ErrClosed) {
				cancel()
				return fmt.Errorf("serve %s: %w", ln.Addr(), err)
			}
			// Transient failures (too many open files): back off and retry.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			s.log.Warn("accept failed", "addr", ln.Addr(), "err", err, "retry_in", backoff)
			select {
			case <-time.After(backoff):
			case <-ctx.Done():
				return nil
			}
			continue
		}
		backoff = 0
		wg.Go(func() { s.serveConn(ctx, nc, false) })
	}
}

// ServeConn serves one already-accepted connection (a socket pair to a
// worker process, say) until it ends, ctx is cancelled or Close is called.
// It returns nil when the connection ended normally, else why it was
// refused or cut.
func (s *Server) ServeConn(ctx context.Context, nc net.Conn) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(s.ctx, cancel)
	defer stop()
	return s.serveConn(ctx, nc, false)
}

// ServeFrames serves one already-accepted connection whose dialer used
// NewFrameClient: after the hello, requests and responses are plain frames
// on nc itself, with no yamux session and no bulk streams. It is meant for
// internal links (a device daemon's calls to its worker), where it saves
// the multiplexer's goroutine hand-offs; it returns as ServeConn does.
func (s *Server) ServeFrames(ctx context.Context, nc net.Conn) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(s.ctx, cancel)
	defer stop()
	return s.serveConn(ctx, nc, true)
}

// ServeAdopted serves plain frames (as ServeFrames does) on a connection
// whose hello another process already checked: a device session's call
// connection, handed by the daemon to its worker. role is what that hello
// said. It returns as ServeConn does.
func (s *Server) ServeAdopted(ctx context.Context, nc net.Conn, role Role) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(s.ctx, cancel)
	defer stop()
	defer nc.Close()
	cctx, ccancel := context.WithCancel(ctx)
	defer ccancel()
	c := &Conn{
		srv:    s,
		role:   role,
		nc:     nc,
		log:    s.log.With("remote", nc.RemoteAddr().String(), "role", role),
		ctx:    cctx,
		cancel: ccancel,
		sem:    make(chan struct{}, s.cfg.MaxInFlight),
		work:   make(chan Request),
	}
	return c.servePlain(cctx, ccancel)
}

// serveConn runs one connection: hello (with admission by OnConnect), yamux,
// control stream, bulk streams. With plain, requests come as frames on nc
// itself and there is no yamux session.
func (s *Server) serveConn(ctx context.Context, nc net.Conn, plain bool) error {
	defer nc.Close()
	cctx, ccancel := context.WithCancel(ctx)
	defer ccancel()
	c := &Conn{
		srv:    s,
		nc:     nc,
		log:    s.log.With("remote", nc.RemoteAddr().String()),
		ctx:    cctx,
		cancel: ccancel,
		sem:    make(chan struct{}, s.cfg.MaxInFlight),
		work:   make(chan Request),
	}
	if err := s.handshake(ctx, c); err != nil {
		if ctx.Err() != nil {
			c.log.Debug("handshake cut short: server stopping", "err", err)
		} else if errors.Is(err, errBadMagic) {
			c.log.Warn("dropped a connection that does not speak kiln", "err", err)
		} else if errors.Is(err, ErrUnauthorized) {
			s.refused.Note(s.log, peerHost(nc), "hello refused", "err", err)
		} else {
			c.log.Warn("handshake failed", "err", err)
		}
		return err
	}
	if s.cfg.OnDisconnect != nil {
		defer s.cfg.OnDisconnect(c) // runs after every handler has returned
	}
	if c.role.Raw() {
		stop := context.AfterFunc(cctx, func() { nc.Close() })
		defer stop()
		err := s.cfg.OnRaw(cctx, c, nc)
		c.log.Debug("raw connection closed", "err", err)
		return err
	}
	if plain {
		return c.servePlain(cctx, ccancel)
	}

	sess, err := yamux.Server(coalesce(nc), muxConfig(s.cfg.KeepAlive, c.log))
	if err != nil {
		return fmt.Errorf("start yamux: %w", err)
	}
	defer sess.Close()
	actx, acancel := context.WithTimeout(cctx, s.cfg.HandshakeTimeout)
	ctl, err := sess.AcceptStreamWithContext(actx)
	acancel()
	if err != nil {
		err = fmt.Errorf("accept control stream: %w", err)
		c.log.Warn("handshake failed", "err", err)
		return err
	}
	c.sess, c.ctl = sess, ctl
	c.log.Debug("connection open")

	var wg sync.WaitGroup
	wg.Go(func() {
		<-cctx.Done()
		sess.Close()
	})
	wg.Go(func() { c.acceptBulk(&wg) })
	err = c.readRequests(&wg)
	ccancel()
	wg.Wait()
	c.log.Debug("connection closed", "err", err)
	return err
}

// servePlain reads requests as plain frames on c.nc until it ends or cctx
// does.
func (c *Conn) servePlain(cctx context.Context, ccancel context.CancelFunc) error {
	nc := c.nc
	c.ctl = nc
	c.log.Debug("connection open (plain frames)")
	var wg sync.WaitGroup
	wg.Go(func() {
		<-cctx.Done()
		nc.Close()
	})
	err := c.readRequests(&wg)
	ccancel()
	wg.Wait()
	c.log.Debug("connection closed", "err", err)
	return err
}

// handshake reads the hello under the handshake deadline, admits the peer
// (token, role, OnConnect) and answers. On success c.role is set.
func (s *Server) handshake(ctx context.Context, c *Conn) error {
	nc := c.nc
	if err := nc.SetDeadline(time.Now().Add(s.cfg.HandshakeTimeout)); err != nil {
		return fmt.Errorf("handshake: %w", err)
	}
	stop := context.AfterFunc(ctx, func() { nc.SetDeadline(time.Unix(1, 0)) })
	h, err := ReadHello(nc)
	rep := HelloReply{Version: ProtocolVersion, Status: StatusOK, Message: s.cfg.Kind}
	var user string
	var authErr error
	peer := peerHost(nc)
	var blocked bool
	var left time.Duration
	if s.fails != nil {
		blocked, left = s.fails.Blocked(peer)
	}
	if err == nil && s.cfg.Authenticate != nil && !blocked {
		user, authErr = s.cfg.Authenticate(h.Token, h.Role)
	}
	switch {
	case errors.Is(err, errBadMagic):
		stop()
		return err
	case errors.Is(err, ErrVersion):
		rep.Status, rep.Message = StatusBadVersion, err.Error()
	case errors.Is(err, ErrBadRequest):
		rep.Status, rep.Message = StatusBadHello, err.Error()
	case err != nil:
		stop()
		if ctx.Err() != nil {
			return fmt.Errorf("handshake: %w", ctx.Err())
		}
		return err
	case blocked:
		// Checked before the token, so that a guesser's hellos cost no
		// token check (a device asks the tracker about every lease token).
		rep.Status, rep.Message = StatusBadToken, fmt.Sprintf("authentication failed: too many wrong tokens from this address; retry in %s", left.Round(time.Second))
		err = newError(CodeUnauthorized, rep.Message)
	case authErr != nil && errors.As(authErr, new(*TokenRefusal)):
		// A token this listener knows and refuses, for a reason its
		// holder is told.
		rep.Status, rep.Message = StatusBadToken, "authentication failed: "+authErr.Error()
		err = newError(CodeUnauthorized, rep.Message)
	case authErr != nil && errors.Is(authErr, ErrUnauthorized):
		rep.Status, rep.Message = StatusBadToken, "authentication failed: wrong token"
		err = tokenRefused(h)
	case authErr != nil:
		rep.Status, rep.Message = StatusBadRole, authErr.Error()
		err = newError(CodeUnauthorized, authErr.Error())
	case s.cfg.Authenticate == nil && s.cfg.Token != "" && !tokenEqual(h.Token, s.cfg.Token):
		rep.Status, rep.Message = StatusBadToken, "authentication failed: wrong token"
		err = tokenRefused(h)
	case !h.Role.Valid() || (len(s.cfg.Roles) > 0 && !slices.Contains(s.cfg.Roles, h.Role)) || (h.Role.Raw() && s.cfg.OnRaw == nil):
		rep.Status, rep.Message = StatusBadRole, fmt.Sprintf("this listener does not serve role %s", h.Role)
		err = newError(CodeBadRequest, rep.Message)
	default:
		c.role = h.Role
		c.user = user
		if s.cfg.Authenticate != nil {
			c.cred = h.Token
		}
		c.log = c.log.With("role", h.Role)
		if user != "" {
			c.log = c.log.With("user", user)
		}
		if s.cfg.OnConnect != nil {
			if err = s.admit(c); err != nil {
				we := ToWire(err)
				rep.Status, rep.Message = StatusRefused, string(we.Code)+" "+we.Message
				err = fmt.Errorf("connection refused: %w", err)
			}
		}
	}
	if rep.Status == StatusBadToken && !blocked && s.fails != nil && !errors.As(authErr, new(*TokenRefusal)) {
		s.fails.Fail(peer)
	}
	werr := WriteHelloReply(nc, rep)
	if !stop() {
		return fmt.Errorf("handshake: %w", ctx.Err())
	}
	if err != nil {
		if werr == nil {
			lingerClose(nc)
		}
		return err
	}
	if werr != nil {
		return werr
	}
	if err := nc.SetDeadline(time.Time{}); err != nil {
		return fmt.Errorf("handshake: %w", err)
	}
	return nil
}

// admit runs OnConnect, turning a panic into an error.
func (s *Server) admit(c *Conn) (err error) {
	defer c.recover("OnConnect", &err)
	return s.cfg.OnConnect(c.ctx, c)
}

// lingerClose lets a refusal reach the peer: closing a socket that still
// holds unread input (the rest of a refused hello) may reset the connection
// before the peer reads the reply. It half-closes, then reads briefly until
// the peer, having read the reply, closes its end.
func lingerClose(nc net.Conn) {
	if cw, ok := nc.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
	}
	nc.SetReadDeadline(time.Now().Add(time.Second))
	io.Copy(io.Discard, io.LimitReader(nc, 64<<10))
}

// handler looks method up.
func (s *Server) handler(method string) HandlerFunc {
	s.hmu.RLock()
	defer s.hmu.RUnlock()
	return s.handlers[method]
}

// bulkHandler looks a bulk method up.
func (s *Server) bulkHandler(method string) BulkHandlerFunc {
	s.hmu.RLock()
	defer s.hmu.RUnlock()
	return s.bulk[method]
}

// Conn is one accepted connection as its handlers see it. It carries
// per-connection state for the daemon (SetValue, Value) and a context that
// ends when the connection does.
type Conn struct {
	srv  *Server
	role Role
	user string // from ServerConfig.Authenticate
	// cred is the token the hello carried, kept when Authenticate admitted
	// it (a listener that takes several kinds of credential).
	cred string
	nc   net.Conn
	sess *yamux.Session
	log  *slog.Logger

	ctx    context.Context
	cancel context.CancelFunc
	sem    chan struct{}
	work   chan Request // hands requests to idle dispatchers
	idle   atomic.Int32 // dispatchers waiting on work

	wmu sync.Mutex // serializes writes on ctl
	ctl net.Conn   // the control stream, or nc itself for ServeFrames

	vmu    sync.Mutex
	values map[any]any
}

// Role returns the role the peer declared in its hello.
func (c *Conn) Role() Role { return c.role }

// User returns the user name ServerConfig.Authenticate gave the peer ("" for
// none).
func (c *Conn) User() string { return c.user }

// Credential returns the token the peer's hello carried when
// ServerConfig.Authenticate admitted it ("" otherwise), for a listener that
// takes several kinds of credential and must know which one a peer used.
func (c *Conn) Credential() string { return c.cred }

// RemoteAddr returns the peer's address.
func (c *Conn) RemoteAddr() net.Addr { return c.nc.RemoteAddr() }

// Context returns a context that ends when the connection ends or the
// server stops.
func (c *Conn) Context() context.Context { return c.ctx }

// Value returns the value stored under key, or nil.
func (c *Conn) Value(key any) any {
	c.vmu.Lock()
	defer c.vmu.Unlock()
	return c.values[key]
}

// SetValue stores value under key for the life of the connection.
func (c *Conn) SetValue(key, value any) {
	c.vmu.Lock()
	defer c.vmu.Unlock()
	if c.values == nil {
		c.values = make(map[any]any)
	}
	c.values[key] = value
}

// Close ends the connection: running handlers see their context end and the
// peer sees ErrUnavailable on its pending calls. It is idempotent.
func (c *Conn) Close() error {
	c.cancel()
	return nil
}

// readRequests reads the control stream until it ends or breaks the
// protocol, starting a goroutine (owned by wg) per request.
func (c *Conn) readRequests(wg *sync.WaitGroup) error {
	r := bufio.NewReaderSize(c.ctl, 64<<10)
	for {
		b, err := ReadFrame(r, c.srv.cfg.MaxFrameSize)
		if err != nil {
			if errors.Is(err, ErrTooLarge) {
				c.log.Warn("closing connection: oversized frame", "err", err)
				c.sendFatal(err)
				return err
			}
			return nil // the peer went away or the server stopped
		}
		req, err := DecodeRequest(b)
		if err != nil {
			c.log.Warn("closing connection: malformed frame", "err", err)
			c.sendFatal(err)
			return err
		}
		select {
		case c.sem <- struct{}{}:
		case <-c.ctx.Done():
			return nil
		}
		select {
		case c.work <- req: // an idle dispatcher takes it
		default:
			wg.Go(func() { c.dispatcher(req) })
		}
	}
}

// maxIdleDispatchers bounds the dispatcher goroutines a connection keeps
// waiting for requests.
const maxIdleDispatchers = 4

// dispatcher runs req and then, while few others are idle, waits for the
// next request the reader hands over. Reusing goroutines spares each
// request a goroutine start and the stack growth that follows.
func (c *Conn) dispatcher(req Request) {
	for {
		c.dispatch(req)
		<-c.sem
		if c.idle.Add(1) > maxIdleDispatchers {
			c.idle.Add(-1)
			return
		}
		select {
		case req = <-c.work:
			c.idle.Add(-1)
		case <-c.ctx.Done():
			c.idle.Add(-1)
			return
		}
	}
}

// dispatch runs one request and writes its response.
func (c *Conn) dispatch(req Request) {
	resp := Response{ID: req.ID}
	result, err := c.run(req)
	if c.ctx.Err() != nil {
		// The connection is ending (the peer left, or the server stops): no
		// answer, so the caller sees ErrUnavailable, not a cancellation.
		return
	}
	if err == nil {
		resp.Result, err = marshal(result)
		if err != nil {
			err = fmt.Errorf("encode result of %q: %v: %w", req.Method, err, ErrInternal)
		}
	}
	if err != nil {
		resp.Result, resp.Error = msgpackNil, ToWire(err)
	}
	frame, err := EncodeFrame(resp, c.srv.cfg.MaxFrameSize)
	if err != nil {
		resp.Result, resp.Error = msgpackNil, ToWire(fmt.Errorf("result of %q: %w", req.Method, err))
		if frame, err = EncodeFrame(resp, c.srv.cfg.MaxFrameSize); err != nil {
			c.log.Error("encode response", "method", req.Method, "err", err)
			c.cancel()
			return
		}
	}
	c.wmu.Lock()
	_, err = c.ctl.Write(frame)
	c.wmu.Unlock()
	if err != nil {
		c.log.Debug("write response", "method", req.Method, "err", err)
		c.cancel()
	}
}

// run checks the request's deadline and calls its handler.
func (c *Conn) run(req Request) (result any, err error) {
	if req.Deadline != 0 && time.Now().UnixNano() >= req.Deadline {
		return nil, newError(CodeDeadline, fmt.Sprintf("request %d (%q): deadline passed before it ran", req.ID, req.Method))
	}
	fn := c.srv.handler(req.Method)
	if fn == nil {
		return nil, newError(CodeNotFound, fmt.Sprintf("unknown method %q", req.Method))
	}
	ctx := c.ctx
	if req.Deadline != 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, time.Unix(0, req.Deadline))
		defer cancel()
	}
	defer c.recover(req.Method, &err)
	return fn(ctx, c, req.Args)
}

// recover turns a handler's panic into an ErrInternal naming the method.
func (c *Conn) recover(method string, err *error) {
	if p := recover(); p != nil {
		c.log.Error("handler panicked", "method", method, "panic", p, "stack", string(debug.Stack()))
		*err = fmt.Errorf("handler %q panicked: %v: %w", method, p, ErrInternal)
	}
}

// sendFatal tells the peer why its connection is about to close: a Response
// with ID 0. Best effort, bounded by a short deadline.
func (c *Conn) sendFatal(err error) {
	frame, ferr := EncodeFrame(Response{ID: 0, Result: msgpackNil, Error: ToWire(err)}, c.srv.cfg.MaxFrameSize)
	if ferr != nil {
		return
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	c.ctl.SetWriteDeadline(time.Now().Add(time.Second))
	c.ctl.Write(frame)
}

// acceptBulk accepts bulk streams until the session ends, starting a
// goroutine (owned by wg) per stream.
func (c *Conn) acceptBulk(wg *sync.WaitGroup) {
	for {
		st, err := c.sess.AcceptStreamWithContext(c.ctx)
		if err != nil {
			return
		}
		select {
		case c.sem <- struct{}{}:
		case <-c.ctx.Done():
			st.Close()
			return
		}
		wg.Go(func() {
			defer func() { <-c.sem }()
			c.serveBulk(st)
		})
	}
}

// serveBulk serves one bulk stream: header, upload, handler, reply, download.
func (c *Conn) serveBulk(st *yamux.Stream) {
	defer st.Close()
	st.SetReadDeadline(time.Now().Add(c.srv.cfg.HandshakeTimeout))
	b, err := ReadFrame(st, maxBulkHeader)
	if err != nil {
		c.log.Warn("bulk stream: read header", "err", err)
		return
	}
	h, err := decodeBulkHeader(b)
	if err != nil {
		c.log.Warn("bulk stream: bad header", "err", err)
		writeBulkHeader(st, BulkHeader{Error: ToWire(err)})
		return
	}
	st.SetReadDeadline(time.Time{})
	reply := BulkHeader{ID: h.ID, Name: h.Name}
	out, err := c.runBulk(st, h)
	if c.ctx.Err() != nil {
		return
	}
	if err != nil {
		reply.Error = ToWire(err)
		writeBulkHeader(st, reply)
		return
	}
	if out.Body == nil {
		out.Size = 0
	}
	if closer, ok := out.Body.(io.Closer); ok {
		defer closer.Close()
	}
	if out.Name != "" {
		reply.Name = out.Name
	}
	reply.Size = out.Size
	if err := writeBulkHeader(st, reply); err != nil {
		c.log.Debug("bulk stream: write reply", "method", h.Method, "err", err)
		return
	}
	if out.Size > 0 {
		if _, err := copyExactly(st, out.Body, out.Size); err != nil {
			// The peer sees a short body and reports it.
			c.log.Warn("bulk stream: send body", "method", h.Method, "name", h.Name, "err", err)
		}
	}
}

// runBulk checks a bulk header, runs its handler over the upload and drains
// what the handler left unread.
func (c *Conn) runBulk(st *yamux.Stream, h BulkHeader) (out Bulk, err error) {
	switch {
	case h.Deadline != 0 && time.Now().UnixNano() >= h.Deadline:
		return Bulk{}, newError(CodeDeadline, fmt.Sprintf("bulk %d (%q): deadline passed before it ran", h.ID, h.Method))
	case h.Size > c.srv.cfg.MaxBulkSize:
		return Bulk{}, newError(CodeTooLarge, fmt.Sprintf("bulk %q of %d bytes exceeds the limit of %d bytes", h.Name, h.Size, c.srv.cfg.MaxBulkSize))
	}
	fn := c.srv.bulkHandler(h.Method)
	if fn == nil {
		return Bulk{}, newError(CodeNotFound, fmt.Sprintf("unknown bulk method %q", h.Method))
	}
	ctx := c.ctx
	if h.Deadline != 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, time.Unix(0, h.Deadline))
		defer cancel()
		st.SetDeadline(time.Unix(0, h.Deadline))
	}
	stop := context.AfterFunc(ctx, func() { st.SetDeadline(time.Unix(1, 0)) })
	defer stop()

	body := &bulkReader{r: st, n: h.Size}
	out, err = func() (out Bulk, err error) {
		defer c.recover(h.Method, &err)
		return fn(ctx, c, Bulk{Name: h.Name, Size: h.Size, Body: body})
	}()
	if err != nil {
		return Bulk{}, err
	}
	if body.n > 0 {
		if _, err := io.Copy(io.Discard, body); err != nil {
			return Bulk{}, fmt.Errorf("bulk %q: %w", h.Name, err)
		}
	}
	return out, nil
}

// writeBulkHeader writes h as a frame.
func writeBulkHeader(w io.Writer, h BulkHeader) error {
	return WriteFrame(w, h, maxBulkHeader)
}

// bulkReader reads exactly n bytes of a bulk body: a stream that ends early
// gives io.ErrUnexpectedEOF. WriteTo copies with a large buffer.
type bulkReader struct {
	r io.Reader
	n int64
}

func (b *bulkReader) Read(p []byte) (int, error) {
	if b.n <= 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > b.n {
		p = p[:b.n]
	}
	n, err := b.r.Read(p)
	b.n -= int64(n)
	if err == io.EOF && b.n > 0 {
		err = io.ErrUnexpectedEOF
	}
	if err == io.EOF {
		err = nil
	}
	return n, err
}

// WriteTo copies the rest of the body to w.
func (b *bulkReader) WriteTo(w io.Writer) (int64, error) {
	buf := copyBufs.Get().(*[]byte)
	defer copyBufs.Put(buf)
	var total int64
	for b.n > 0 {
		n, err := b.Read(*buf)
		if n > 0 {
			m, werr := w.Write((*buf)[:n])
			total += int64(m)
			if werr != nil {
				return total, werr
			}
		}
		if err != nil {
			return total, err
		}
	}
	return total, nil
}

var copyBufs = sync.Pool{New: func() any { b := make([]byte, copyBufSize); return &b }}

// copyExactly copies n bytes from r to w with a large buffer; r yielding
// fewer bytes is io.ErrUnexpectedEOF.
func copyExactly(w io.Writer, r io.Reader, n int64) (int64, error) {
	buf := copyBufs.Get().(*[]byte)
	defer copyBufs.Put(buf)
	got, err := io.CopyBuffer(onlyWriter{w}, io.LimitReader(r, n), *buf)
	if err == nil && got < n {
		err = io.ErrUnexpectedEOF
	}
	return got, err
}

// onlyWriter hides a writer's ReadFrom so io.CopyBuffer uses its buffer.
type onlyWriter struct{ w io.Writer }

func (o onlyWriter) Write(p []byte) (int, error) { return o.w.Write(p) }

// tokenRefused is the server side's error for a hello whose token was
// refused: it says whether the peer sent none or a wrong one.
// TokenRefusal is an error of ServerConfig.Authenticate that refuses a
// token it knows, for a reason the peer is told (a wrong token is told
// nothing but that). It is ErrUnauthorized to errors.Is.
type TokenRefusal struct{ Reason string }

func (e *TokenRefusal) Error() string        { return e.Reason }
func (e *TokenRefusal) Is(target error) bool { return target == ErrUnauthorized }

// peerHost is the IP address of nc's peer (its whole address when it has
// no port).
func peerHost(nc net.Conn) string {
	a := nc.RemoteAddr().String()
	if h, _, err := net.SplitHostPort(a); err == nil {
		return h
	}
	return a
}

func tokenRefused(h Hello) error {
	if h.Token == "" {
		return newError(CodeUnauthorized, fmt.Sprintf("authentication failed: no token from a %s", h.Role))
	}
	return newError(CodeUnauthorized, fmt.Sprintf("authentication failed: wrong token from a %s", h.Role))
}
