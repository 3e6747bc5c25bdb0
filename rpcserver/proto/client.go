package proto

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/yamux"
	"github.com/vmihailenco/msgpack/v5"
)

// DialOptions configures Dial and NewClient.
type DialOptions struct {
	// Role is what this side is (RoleClient when 0).
	Role Role
	// Token is the listener's auth token.
	Token string
	// TLS, when set, wraps the TCP connection in TLS (see TLSConfig.Client).
	// An empty ServerName is taken from the address.
	TLS *tls.Config
	// HandshakeTimeout bounds the TLS handshake and the hello
	// (DefaultHandshakeTimeout when 0); ctx's deadline bounds them too.
	HandshakeTimeout time.Duration
	// MaxFrameSize bounds one request or response frame (DefaultMaxFrameSize when 0).
	MaxFrameSize int
	// KeepAlive is the yamux ping interval (DefaultKeepAlive when 0, off when negative).
	KeepAlive time.Duration
	// Logger receives the client's debug logs (slog.Default() when nil).
	Logger *slog.Logger
	// Expect, when set, is the kind of listener the dialer means to reach
	// (ListenerTracker, ListenerDevice): a listener that names another kind in
	// its hello reply is refused with a *PeerKindError.
	Expect string
}

// Client is the dialing end of the kiln protocol: one connection on which
// calls and bulk transfers run concurrently. It is safe for concurrent use.
type Client struct {
	addr     string
	sess     *yamux.Session // nil on a plain frame connection (NewFrameClient)
	ctl      net.Conn       // the control stream, or the connection itself
	maxFrame int

	nextID atomic.Uint64
	wmu    sync.Mutex // serializes writes on ctl

	mu      sync.Mutex
	pending map[uint64]chan Response

	done     chan struct{}
	err      error // why the connection ended; set before done closes
	shutOnce sync.Once
	wg       sync.WaitGroup // the reader goroutine
}

// Dial connects to a kiln listener at addr (host:port), over TLS when
// opts.TLS is set, and says hello. ctx bounds the dial and the handshake,
// not the Client's life. A dial that fails wraps ErrUnavailable; a refused
// hello wraps ErrUnauthorized, ErrVersion or ErrBadRequest.
func Dial(ctx context.Context, addr string, opts DialOptions) (*Client, error) {
	nc, err := dialConn(ctx, addr, opts)
	if err != nil {
		return nil, err
	}
	c, err := NewClient(ctx, nc, opts)
	if pk := (*PeerKindError)(nil); errors.As(err, &pk) {
		pk.Addr = addr // as the caller wrote it; the error names it
		return nil, pk
	}
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", addr, err)
	}
	return c, nil
}

// DialRaw connects to addr as Dial does and says hello with opts.Role
// (RoleBulk), but starts no multiplexer: the caller owns the returned
// connection and speaks on it what the listener's OnRaw expects.
func DialRaw(ctx context.Context, addr string, opts DialOptions) (net.Conn, error) {
	nc, err := dialConn(ctx, addr, opts)
	if err != nil {
		return nil, err
	}
	if err := clientHello(ctx, nc, opts); err != nil {
		nc.Close()
		return nil, fmt.Errorf("dial %s: %w", addr, err)
	}
	return nc, nil
}

// dialConn opens the TCP connection and, when opts.TLS is set, runs the
// TLS handshake.
func dialConn(ctx context.Context, addr string, opts DialOptions) (net.Conn, error) {
	var d net.Dialer
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctxError("dial "+addr, ctx)
		}
		return nil, fmt.Errorf("dial %s: %w", addr, newError(CodeUnavailable, err.Error()))
	}
	if opts.TLS != nil {
		cfg := opts.TLS.Clone()
		if cfg.ServerName == "" {
			if host, _, err := net.SplitHostPort(addr); err == nil {
				cfg.ServerName = host
			}
		}
		tc := tls.Client(nc, cfg)
		hctx, cancel := context.WithTimeout(ctx, handshakeTimeout(opts.HandshakeTimeout))
		err := tc.HandshakeContext(hctx)
		cancel()
		if err != nil {
			nc.Close()
			if ctx.Err() != nil {
				return nil, ctxError("dial "+addr, ctx)
			}
			return nil, fmt.Errorf("dial %s: tls handshake: %w", addr, newError(CodeUnauthorized, err.Error()))
		}
		nc = tc
	}
	return nc, nil
}

// NewClient says hello on an established connection (a socket pair to a
// worker process, say) and returns a Client that owns nc. On failure nc is
// closed.
func NewClient(ctx context.Context, nc net.Conn, opts DialOptions) (*Client, error) {
	if opts.Role == 0 {
		opts.Role = RoleClient
	}
	if opts.MaxFrameSize <= 0 {
		opts.MaxFrameSize = DefaultMaxFrameSize
	}
	if opts.KeepAlive == 0 {
		opts.KeepAlive = DefaultKeepAlive
	}
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	if err := clientHello(ctx, nc, opts); err != nil {
		nc.Close()
		return nil, err
	}
	sess, err := yamux.Client(coalesce(nc), muxConfig(opts.KeepAlive, log.With("remote", nc.RemoteAddr().String())))
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("start yamux: %w", err)
	}
	ctl, err := sess.OpenStream()
	if err != nil {
		sess.Close()
		return nil, fmt.Errorf("open control stream: %w", newError(CodeUnavailable, err.Error()))
	}
	return startClient(nc, sess, ctl, opts.MaxFrameSize), nil
}

// NewFrameClient says hello on an established connection and returns a
// Client that sends its requests as plain frames on nc itself, with no
// yamux session: the peer must serve nc with Server.ServeFrames. Such a
// Client makes calls only (Bulk fails with ErrBadRequest); it saves the
// multiplexer's goroutine hand-offs on an internal link (the device
// daemon's calls to its worker). It owns nc; on failure nc is closed.
func NewFrameClient(ctx context.Context, nc net.Conn, opts DialOptions) (*Client, error) {
	if opts.Role == 0 {
		opts.Role = RoleClient
	}
	if opts.MaxFrameSize <= 0 {
		opts.MaxFrameSize = DefaultMaxFrameSize
	}
	if err := clientHello(ctx, nc, opts); err != nil {
		nc.Close()
		return nil, err
	}
	return startClient(nc, nil, nc, opts.MaxFrameSize), nil
}

// NewAdoptedFrameClient returns a Client that sends its requests as plain
// frames on nc, whose hello was said already (DialRaw with RoleCall, and
// the ticket exchange after it): a device session's call connection,
// served by the session's worker with Server.ServeAdopted. Like
// NewFrameClient's, it makes calls only. It owns nc.
func NewAdoptedFrameClient(nc net.Conn, opts DialOptions) *Client {
	if opts.MaxFrameSize <= 0 {
		opts.MaxFrameSize = DefaultMaxFrameSize
	}
	return startClient(nc, nil, nc, opts.MaxFrameSize)
}

// startClient builds a Client on its control stream and starts its reader.
func startClient(nc net.Conn, sess *yamux.Session, ctl net.Conn, maxFrame int) *Client {
	c := &Client{
		addr:     nc.RemoteAddr().String(),
		sess:     sess,
		ctl:      ctl,
		maxFrame: maxFrame,
		pending:  make(map[uint64]chan Response),
		done:     make(chan struct{}),
	}
	c.wg.Go(c.readResponses)
	return c
}

// closeTransport closes the yamux session, or the plain connection.
func (c *Client) closeTransport() {
	if c.sess != nil {
		c.sess.Close()
		return
	}
	c.ctl.Close()
}

// clientHello sends the hello and checks the reply, under the handshake
// deadline and ctx.
func clientHello(ctx context.Context, nc net.Conn, opts DialOptions) error {
	deadline := time.Now().Add(handshakeTimeout(opts.HandshakeTimeout))
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	if err := nc.SetDeadline(deadline); err != nil {
		return fmt.Errorf("hello: %w", err)
	}
	stop := context.AfterFunc(ctx, func() { nc.SetDeadline(time.Unix(1, 0)) })
	err := WriteHello(nc, Hello{Version: ProtocolVersion, Role: opts.Role, Token: opts.Token})
	var rep HelloReply
	if err == nil {
		rep, err = ReadHelloReply(nc)
	}
	if !stop() {
		return ctxError("hello", ctx)
	}
	if err != nil {
		if errors.Is(err, ErrBadRequest) {
			return err
		}
		return fmt.Errorf("hello: %w", newError(CodeUnavailable, err.Error()))
	}
	if err := rep.Err(); err != nil {
		if opts.Token == "" && errors.Is(err, ErrUnauthorized) {
			return newError(CodeUnauthorized, "authentication failed: no token was given and the server requires one")
		}
		return err
	}
	if opts.Expect != "" && rep.Message != "" && rep.Message != opts.Expect {
		return &PeerKindError{Addr: nc.RemoteAddr().String(), Got: rep.Message, Want: opts.Expect}
	}
	if err := nc.SetDeadline(time.Time{}); err != nil {
		return fmt.Errorf("hello: %w", err)
	}
	return nil
}

func handshakeTimeout(d time.Duration) time.Duration {
	if d <= 0 {
		return DefaultHandshakeTimeout
	}
	return d
}

// CallError is the error Client.Call returns as it is (wrapped in nothing)
// when the peer answered the call with an error: "call METHOD: MESSAGE".
// A caller that names what it called in its own words (a function rather
// than the method that calls functions) says Err instead.
type CallError struct {
	Method string
	Err    *WireError
}

func (e *CallError) Error() string { return fmt.Sprintf("call %q: %s", e.Method, e.Err) }

// Unwrap returns the peer's error, which unwraps to its code's sentinel.
func (e *CallError) Unwrap() error { return e.Err }

// Call runs method on the peer with args and decodes its result into result
// (a pointer, or nil to discard; a *msgpack.RawMessage receives the raw
// encoding). ctx's deadline travels with the request, so the peer stops
// working when it passes. A failed call's error wraps the sentinel of the
// peer's code (errors.Is(err, ErrNotFound)); a dropped connection gives
// ErrUnavailable, a passed deadline ErrDeadline, a cancelled ctx ErrCancelled.
func (c *Client) Call(ctx context.Context, method string, args, result any) error {
	if ctx.Err() != nil {
		return ctxError(fmt.Sprintf("call %q", method), ctx)
	}
	select {
	case <-c.done:
		return fmt.Errorf("call %q: %w", method, c.err)
	default:
	}
	a, err := marshal(args)
	if err != nil {
		return fmt.Errorf("call %q: encode args: %v: %w", method, err, ErrBadRequest)
	}
	req := Request{ID: c.nextID.Add(1), Method: method, Args: a}
	if d, ok := ctx.Deadline(); ok {
		req.Deadline = d.UnixNano()
	}
	frame, err := EncodeFrame(req, c.maxFrame)
	if err != nil {
		return fmt.Errorf("call %q: %w", method, err)
	}

	ch := make(chan Response, 1)
	c.mu.Lock()
	c.pending[req.ID] = ch
	c.mu.Unlock()
	c.wmu.Lock()
	_, err = c.ctl.Write(frame)
	c.wmu.Unlock()
	if err != nil {
		// The stream is broken. The reader still delivers what arrived
		// before the break (a peer's last word on why it closed), then ends
		// the Client; its reason is the one to report.
		c.forget(req.ID)
		c.closeTransport()
		<-c.done
		return fmt.Errorf("call %q: %w", method, c.err)
	}

	var resp Response
	select {
	case resp = <-ch:
	case <-ctx.Done():
		c.forget(req.ID)
		return ctxError(fmt.Sprintf("call %q", method), ctx)
	case <-c.done:
		select {
		case resp = <-ch:
		default:
			c.forget(req.ID)
			return fmt.Errorf("call %q: %w", method, c.err)
		}
	}
	if resp.Error != nil {
		return &CallError{Method: method, Err: resp.Error}
	}
	switch r := result.(type) {
	case nil:
	case *msgpack.RawMessage:
		*r = resp.Result
	default:
		if err := msgpack.Unmarshal(resp.Result, result); err != nil {
			return fmt.Errorf("call %q: decode result: %v: %w", method, err, ErrBadRequest)
		}
	}
	return nil
}

// forget drops a pending call.
func (c *Client) forget(id uint64) {
	c.mu.Lock()
	delete(c.pending, id)
	c.mu.Unlock()
}

// readResponses hands each response to its pending call until the control
// stream ends; then the Client is done.
func (c *Client) readResponses() {
	r := bufio.NewReaderSize(c.ctl, 64<<10)
	for {
		b, err := ReadFrame(r, c.maxFrame)
		if err != nil {
			if err == io.EOF {
				err = errors.New("closed by the peer")
			}
			c.shutdown(err)
			return
		}
		resp, err := DecodeResponse(b)
		if err != nil {
			c.shutdown(err)
			return
		}
		if resp.ID == 0 {
			c.shutdown(fmt.Errorf("closed by the peer: %w", resp.Error))
			return
		}
		c.mu.Lock()
		ch := c.pending[resp.ID]
		delete(c.pending, resp.ID)
		c.mu.Unlock()
		if ch != nil {
			ch <- resp
		}
	}
}

// shutdown ends the connection once, recording why.
func (c *Client) shutdown(reason error) {
	c.shutOnce.Do(func() {
		c.err = newError(CodeUnavailable, fmt.Sprintf("connection to %s lost: %v", c.addr, reason))
		close(c.done)
		c.closeTransport()
	})
}

// Done returns a channel that is closed when the connection ends, for
// whatever reason; Err then says why.
func (c *Client) Done() <-chan struct{} { return c.done }

// Err returns nil while the connection is up, then an error wrapping
// ErrUnavailable that says why it ended.
func (c *Client) Err() error {
	select {
	case <-c.done:
		return c.err
	default:
		return nil
	}
}

// RemoteAddr returns the peer's address.
func (c *Client) RemoteAddr() string { return c.addr }

// Close ends the connection, fails pending calls with ErrUnavailable and
// waits for the Client's goroutine. It is idempotent and returns nil.
func (c *Client) Close() error {
	c.shutdown(errors.New("closed by this client"))
	c.wg.Wait()
	return nil
}

// Bulk runs the peer's bulk method on a stream of its own: it sends in
// (Size bytes of Body after a header naming method and in.Name), and copies
// the bytes the peer sends back to w (discarded when w is nil), returning
// their count. ctx's deadline travels with the header and bounds both copies.
func (c *Client) Bulk(ctx context.Context, method string, in Bulk, w io.Writer) (int64, error) {
	what := fmt.Sprintf("bulk %q %q", method, in.Name)
	if ctx.Err() != nil {
		return 0, ctxError(what, ctx)
	}
	if in.Size < 0 || (in.Size > 0 && in.Body == nil) {
		return 0, fmt.Errorf("%s: size %d with a nil body: %w", what, in.Size, ErrBadRequest)
	}
	if c.sess == nil {
		return 0, fmt.Errorf("%s: this connection carries calls only, no bulk streams: %w", what, ErrBadRequest)
	}
	st, err := c.sess.OpenStream()
	if err != nil {
		return 0, fmt.Errorf("%s: %w", what, c.transportErr(err))
	}
	defer st.Close()
	h := BulkHeader{ID: c.nextID.Add(1), Method: method, Name: in.Name, Size: in.Size}
	if d, ok := ctx.Deadline(); ok {
		h.Deadline = d.UnixNano()
		st.SetDeadline(d)
	}
	stop := context.AfterFunc(ctx, func() { st.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	header, err := EncodeFrame(h, maxBulkHeader)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", what, err)
	}

	// The upload runs beside the wait for the reply, so a peer that refuses
	// early is heard at once. Closing st ends a blocked upload.
	sent := make(chan error, 1)
	go func() {
		_, err := st.Write(header)
		if err == nil && in.Size > 0 {
			_, err = copyExactly(st, in.Body, in.Size)
		}
		if err != nil {
			st.Close()
		}
		sent <- err
	}()
	var sendErr error
	waited := false
	waitSent := func() error {
		if !waited {
			sendErr, waited = <-sent, true
		}
		return sendErr
	}
	defer func() {
		st.Close()
		waitSent()
	}()

	b, err := ReadFrame(st, maxBulkHeader)
	var reply BulkHeader
	if err == nil {
		reply, err = decodeBulkHeader(b)
	}
	if err != nil {
		st.Close()
		// A body that failed to read locally explains the stream's end best.
		if werr := waitSent(); werr != nil && ctx.Err() == nil && c.Err() == nil && !isStreamErr(werr) {
			return 0, fmt.Errorf("%s: send body: %w", what, werr)
		}
		return 0, fmt.Errorf("%s: read reply: %w", what, c.streamErr(ctx, err))
	}
	if reply.Error != nil {
		st.Close()
		if werr := waitSent(); werr != nil && !isStreamErr(werr) {
			return 0, fmt.Errorf("%s: send body: %w", what, werr)
		}
		return 0, fmt.Errorf("%s: %w", what, reply.Error)
	}
	if werr := waitSent(); werr != nil {
		return 0, fmt.Errorf("%s: send body: %w", what, c.streamErr(ctx, werr))
	}
	if reply.Size == 0 {
		return 0, nil
	}
	if w == nil {
		w = io.Discard
	}
	n, err := (&bulkReader{r: st, n: reply.Size}).WriteTo(w)
	if err != nil {
		return n, fmt.Errorf("%s: receive body: %w", what, c.streamErr(ctx, err))
	}
	return n, nil
}

// Upload sends size bytes of r to the peer's bulk method under name.
func (c *Client) Upload(ctx context.Context, method, name string, size int64, r io.Reader) error {
	_, err := c.Bulk(ctx, method, Bulk{Name: name, Size: size, Body: r}, nil)
	return err
}

// Download asks the peer's bulk method for name and copies what it sends
// to w, returning the byte count.
func (c *Client) Download(ctx context.Context, method, name string, w io.Writer) (int64, error) {
	return c.Bulk(ctx, method, Bulk{Name: name}, w)
}

// streamErr explains a failed read or write on a bulk stream: ctx's end,
// the connection's end, or the stream's own failure (ErrUnavailable).
func (c *Client) streamErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctxError("transfer", ctx)
	}
	return c.transportErr(err)
}

// transportErr wraps an I/O error as ErrUnavailable, preferring the
// connection's own reason when it has ended.
func (c *Client) transportErr(err error) error {
	if cerr := c.Err(); cerr != nil {
		return cerr
	}
	if err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	return newError(CodeUnavailable, err.Error())
}

// isStreamErr reports whether err came from the stream rather than from
// the body being uploaded.
func isStreamErr(err error) bool {
	return errors.Is(err, yamux.ErrStreamClosed) || errors.Is(err, yamux.ErrConnectionReset) ||
		errors.Is(err, yamux.ErrSessionShutdown) || errors.Is(err, yamux.ErrTimeout)
}

// ctxError reports ctx's end as ErrDeadline or ErrCancelled; the error also
// wraps ctx.Err().
func ctxError(what string, ctx context.Context) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return fmt.Errorf("%s: %w (%w)", what, ErrDeadline, ctx.Err())
	}
	return fmt.Errorf("%s: %w (%w)", what, ErrCancelled, ctx.Err())
}
