package cli

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	ucli "github.com/urfave/cli/v2"

	"github.com/kiln-ml/kiln/rpcserver/proto"
)

// kiln proxy is TVM's RPC proxy (python/tvm/rpc/proxy.py) for kiln: a
// device daemon behind NAT, which nobody can dial, connects out to the
// proxy (kiln rpcserver --proxy), and the proxy opens a port for it that
// clients dial as if it were the daemon's own. Each client connection the
// proxy accepts there is carried to the daemon over a new connection the
// daemon dials out for it when the proxy asks (over the daemon's control
// connection), so the daemon sees plain TCP connections and serves them as
// it serves any: its token, its sessions, and the call connections it
// hands to its workers. The proxy reads none of what it carries.
//
// The proxy's own protocol, one line each way, on its --listen port:
//
//	daemon → proxy: KILNPROXY1 board TOKEN KEY [PORT]   (control connection;
//	                PORT: the one a daemon connecting again had)
//	proxy → daemon: ok HOST:PORT [TRACKER] | error MESSAGE
//	proxy → daemon: dial ID                       (one per client connection)
//	daemon → proxy: KILNPROXY1 conn TOKEN ID      (a new connection, then raw bytes)
//	client → proxy: KILNPROXY1 lookup KEY
//	proxy → client: ok HOST:PORT | error MESSAGE  (the port of a board serving KEY)
//
// A client that dials the --listen port as it dials a daemon (TVM's
// rpc.connect(proxy_host, proxy_port, key=...)) gets a kiln hello reply
// refusing it with proxyClientRefusal, after which the Python package
// asks the proxy for the board serving its key (lookup) and connects to
// that board's port: the board is matched by key, as TVM's proxy matches
// a client's key with the server that registered it.
const proxyMagic = "KILNPROXY1"

// proxyClientRefusal starts the message of the hello reply a kiln client
// gets on the proxy's --listen port.
const proxyClientRefusal = "kiln proxy: this port is for device daemons"

// How long the proxy waits for a daemon's dial-back, and for a first line.
const (
	proxyDialBack  = 10 * time.Second
	proxyLineLimit = 4096
)

func proxyCommand() *ucli.Command {
	return &ucli.Command{
		Name:      "proxy",
		Usage:     "relay clients to device daemons behind NAT that connect out to it (TVM's RPC proxy)",
		UsageText: "kiln proxy --listen ADDR --token-file F [--public-host HOST] [--ports FIRST-LAST] [--tracker HOST:PORT]",
		Description: `A device daemon that cannot be dialled (a board behind NAT) connects out
to the proxy with kiln rpcserver --proxy HOST:PORT; the proxy opens a port
for it (from --ports, on the --listen host) and tells the daemon its
address as clients reach it (--public-host and that port), which
registers that address with its tracker (with --tracker, the proxy's
tracker for a daemon that names none, as TVM's proxy registers its
servers). Clients dial it as they dial any
daemon; the proxy carries each of their connections to the daemon over a
connection the daemon dials out for it. The daemons must present the
proxy's token (--token-file); what the proxy carries is the kiln protocol,
authenticated by the daemon itself.

Example:
   kiln proxy --listen 0.0.0.0:9095 --public-host gw.example.org --ports 9100-9199 --token-file tok
   kiln rpcserver --proxy gw.example.org:9095 --tracker tracker:9190 --key rpi4 --token-file tok`,
		Flags: []ucli.Flag{
			&ucli.StringFlag{Name: "listen", Value: "127.0.0.1:9095", Usage: "address daemons connect to"},
			&ucli.StringFlag{Name: "public-host", Usage: "host name clients reach the proxy by, in the addresses daemons are given (default: the --listen host; the daemons' ports listen on the --listen host)"},
			&ucli.StringFlag{Name: "ports", Usage: "FIRST-LAST: the ports daemons are given (default: any free port)"},
			&ucli.StringFlag{Name: "token-file", Usage: "file holding the token daemons must present", EnvVars: []string{"KILN_TOKEN_FILE"}},
			&ucli.StringFlag{Name: "tracker", Usage: "HOST:PORT of the tracker a daemon registers with when it was given none"},
		},
		Action: runProxy,
	}
}

func runProxy(c *ucli.Context) error {
	tok, err := readToken(c)
	if err != nil {
		return err
	}
	if tok == "" {
		return errors.New("proxy: give --token-file: the daemons that connect must present its token (anyone else could offer clients a device of theirs)")
	}
	p, err := newProxy(c.String("listen"), c.String("public-host"), c.String("ports"), tok, slog.New(slog.NewTextHandler(c.App.ErrWriter, nil)))
	if err != nil {
		return err
	}
	p.tracker = c.String("tracker")
	if strings.ContainsAny(p.tracker, " \t\n") {
		return fmt.Errorf("proxy: --tracker %q: want HOST:PORT", p.tracker)
	}
	fmt.Fprintf(c.App.ErrWriter, "kiln proxy listening for daemons on %s\n", p.Addr())
	return p.Serve(c.Context)
}

// proxy is kiln proxy's state.
type proxy struct {
	ln         net.Listener
	token      string
	publicHost string
	tracker    string // told to daemons, which register with it when they have no tracker
	first      int    // the port range (0, 0: any free port)
	last       int
	log        *slog.Logger

	mu      sync.Mutex
	waiting map[string]chan net.Conn // dial-back ID → the client's side waiting for it
	boards  map[string][]string      // key → the public addresses of the boards connected with it, oldest first
	next    map[string]int           // key → the board a lookup gives next (round robin)
	wg      sync.WaitGroup
}

func newProxy(listen, publicHost, ports, token string, log *slog.Logger) (*proxy, error) {
	p := &proxy{token: token, log: log, waiting: map[string]chan net.Conn{}, boards: map[string][]string{}, next: map[string]int{}}
	if ports != "" {
		if _, err := fmt.Sscanf(ports, "%d-%d", &p.first, &p.last); err != nil || p.first <= 0 || p.last < p.first || p.last > 65535 {
			return nil, fmt.Errorf("proxy: --ports %q: want FIRST-LAST, such as 9100-9199", ports)
		}
	}
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return nil, fmt.Errorf("proxy: listen: %w", err)
	}
	p.ln = ln
	if publicHost == "" {
		publicHost, _, _ = net.SplitHostPort(ln.Addr().String())
	}
	p.publicHost = publicHost
	return p, nil
}

// Addr is the address daemons connect to.
func (p *proxy) Addr() net.Addr { return p.ln.Addr() }

// Serve accepts daemons and their dial-backs until ctx ends.
func (p *proxy) Serve(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		<-ctx.Done()
		p.ln.Close()
	}()
	defer p.wg.Wait()
	for {
		nc, err := p.ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("proxy: accept: %w", err)
		}
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			p.serveConn(ctx, nc)
		}()
	}
}

// readLine reads one line of at most proxyLineLimit bytes without reading
// past it (the bytes after a dial-back's line are the client's).
func readLine(nc net.Conn) (string, error) {
	var b []byte
	one := make([]byte, 1)
	for len(b) < proxyLineLimit {
		if _, err := io.ReadFull(nc, one); err != nil {
			return "", err
		}
		if one[0] == '\n' {
			return string(b), nil
		}
		b = append(b, one[0])
	}
	return "", fmt.Errorf("line longer than %d bytes", proxyLineLimit)
}

func (p *proxy) serveConn(ctx context.Context, nc net.Conn) {
	nc.SetReadDeadline(time.Now().Add(proxyDialBack))
	// A kiln hello ("KILN", then its version) is a client that took this
	// port for a daemon's; the proxy's own lines start "KILNPROXY1".
	head := make([]byte, len(proto.Magic)+1)
	_, err := io.ReadFull(nc, head)
	if err == nil && string(head[:len(proto.Magic)]) == proto.Magic && head[len(proto.Magic)] != proxyMagic[len(proto.Magic)] {
		p.refuseClient(nc, head)
		return
	}
	line := string(head)
	if err == nil && head[len(head)-1] != '\n' {
		var rest string
		rest, err = readLine(nc)
		line += rest
	}
	line = strings.TrimSuffix(line, "\n")
	nc.SetReadDeadline(time.Time{})
	f := strings.Fields(line)
	if err == nil && len(f) == 3 && f[0] == proxyMagic && f[1] == "lookup" {
		p.lookup(nc, f[2])
		return
	}
	if err != nil || len(f) < 4 || len(f) > 5 || f[0] != proxyMagic || (f[1] != "board" && f[1] != "conn") || (f[1] == "conn" && len(f) != 4) {
		p.log.Warn("proxy: not a kiln daemon's connection", "remote", nc.RemoteAddr(), "err", err)
		fmt.Fprintf(nc, "error not a %s board or conn line\n", proxyMagic)
		nc.Close()
		return
	}
	if !proto.TokenEqual(f[2], p.token) {
		p.log.Warn("proxy: wrong token", "remote", nc.RemoteAddr())
		fmt.Fprintf(nc, "error wrong token\n")
		nc.Close()
		return
	}
	if f[1] == "conn" {
		p.mu.Lock()
		ch := p.waiting[f[3]]
		delete(p.waiting, f[3])
		p.mu.Unlock()
		if ch == nil {
			nc.Close()
			return
		}
		ch <- nc
		return
	}
	want := 0
	if len(f) == 5 {
		// A daemon connecting again asks for the port it had.
		want, _ = strconv.Atoi(f[4])
	}
	p.serveBoard(ctx, nc, f[3], want)
}

// refuseClient answers a kiln client's hello (head is its first bytes)
// with a refusal that says what this port is, and closes the connection.
func (p *proxy) refuseClient(nc net.Conn, head []byte) {
	defer nc.Close()
	if _, err := proto.ReadHello(io.MultiReader(bytes.NewReader(head), nc)); err != nil && !errors.Is(err, proto.ErrVersion) {
		return
	}
	proto.WriteHelloReply(nc, proto.HelloReply{Version: proto.ProtocolVersion, Status: proto.StatusRefused,
		Message: string(proto.CodeBadRequest) + " " + proxyClientRefusal + " (kiln rpcserver --proxy); a client reaches a board by its key " +
			"(Python: rpc.connect(host, port, key=KEY)) or at the port the proxy opened for it (its tracker lists it)"})
}

// lookup answers a client's lookup with the address of a board connected
// with key: each lookup the next of them, when several are.
func (p *proxy) lookup(nc net.Conn, key string) {
	defer nc.Close()
	p.mu.Lock()
	addrs := p.boards[key]
	addr := ""
	if len(addrs) > 0 {
		i := p.next[key] % len(addrs)
		p.next[key] = i + 1
		addr = addrs[i]
	}
	var keys []string
	for k := range p.boards {
		keys = append(keys, strconv.Quote(k))
	}
	p.mu.Unlock()
	if addr == "" {
		sort.Strings(keys)
		known := "none is"
		if len(keys) > 0 {
			known = "connected: " + strings.Join(keys, ", ")
		}
		fmt.Fprintf(nc, "error no board with key %q is connected to the proxy (%s)\n", key, known)
		return
	}
	fmt.Fprintf(nc, "ok %s\n", addr)
}

// addBoard records a board's public address under its key until the
// returned function removes it.
func (p *proxy) addBoard(key, public string) func() {
	p.mu.Lock()
	p.boards[key] = append(p.boards[key], public)
	p.mu.Unlock()
	return func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		rest := slices.DeleteFunc(p.boards[key], func(a string) bool { return a == public })
		if len(rest) == 0 {
			delete(p.boards, key)
			delete(p.next, key)
			return
		}
		p.boards[key] = rest
	}
}

// serveBoard opens a port for the daemon on nc (its control connection)
// and carries every client connection made there to it, until nc closes.
func (p *proxy) serveBoard(ctx context.Context, ctl net.Conn, key string, want int) {
	defer ctl.Close()
	// The proxy's end ends its boards' connections (they connect again
	// to the next proxy on this port).
	stop := context.AfterFunc(ctx, func() { ctl.Close() })
	defer stop()
	pln, err := p.listenPublic(want)
	if err != nil {
		fmt.Fprintf(ctl, "error %v\n", err)
		return
	}
	defer pln.Close()
	_, port, _ := net.SplitHostPort(pln.Addr().String())
	public := net.JoinHostPort(p.publicHost, port)
	if _, err := fmt.Fprintf(ctl, "ok %s %s\n", public, p.tracker); err != nil {
		return
	}
	p.log.Info("proxy: daemon connected", "key", key, "remote", ctl.RemoteAddr(), "public", public)
	defer p.addBoard(key, public)()
	gone := make(chan struct{})
	go func() {
		// The daemon sends nothing more: a read returns when it leaves.
		io.Copy(io.Discard, ctl)
		close(gone)
		pln.Close()
	}()
	var wmu sync.Mutex
	for {
		cc, err := pln.Accept()
		if err != nil {
			p.log.Info("proxy: daemon left", "key", key, "public", public)
			return
		}
		id := randomHex(16)
		ch := make(chan net.Conn, 1)
		p.mu.Lock()
		p.waiting[id] = ch
		p.mu.Unlock()
		wmu.Lock()
		_, err = fmt.Fprintf(ctl, "dial %s\n", id)
		wmu.Unlock()
		if err != nil {
			cc.Close()
			return
		}
		go p.carry(ctx, cc, ch, id, gone)
	}
}

// carry waits for the daemon's dial-back id and copies both ways.
func (p *proxy) carry(ctx context.Context, cc net.Conn, ch chan net.Conn, id string, gone chan struct{}) {
	t := time.NewTimer(proxyDialBack)
	defer t.Stop()
	var dc net.Conn
	select {
	case dc = <-ch:
	case <-t.C:
	case <-gone:
	case <-ctx.Done():
	}
	if dc == nil {
		p.mu.Lock()
		delete(p.waiting, id)
		p.mu.Unlock()
		cc.Close()
		return
	}
	pipe(cc, dc)
}

// pipe copies a to b and b to a until either side ends, then closes both.
func pipe(a, b net.Conn) {
	done := make(chan struct{}, 2)
	cp := func(dst, src net.Conn) {
		io.Copy(dst, src)
		if tc, ok := dst.(*net.TCPConn); ok {
			tc.CloseWrite()
		}
		done <- struct{}{}
	}
	go cp(a, b)
	go cp(b, a)
	<-done
	<-done
	a.Close()
	b.Close()
}

// listenPublic opens a port for a daemon: want when it is free (and in
// --ports), else the first free one.
func (p *proxy) listenPublic(want int) (net.Listener, error) {
	if want > 0 && want <= 65535 && (p.first == 0 || (want >= p.first && want <= p.last)) {
		if ln, err := net.Listen("tcp", net.JoinHostPort(p.listenHost(), strconv.Itoa(want))); err == nil {
			return ln, nil
		}
	}
	if p.first == 0 {
		return net.Listen("tcp", net.JoinHostPort(p.listenHost(), "0"))
	}
	for port := p.first; port <= p.last; port++ {
		ln, err := net.Listen("tcp", net.JoinHostPort(p.listenHost(), fmt.Sprint(port)))
		if err == nil {
			return ln, nil
		}
	}
	return nil, fmt.Errorf("no free port from %d to %d (--ports)", p.first, p.last)
}

// listenHost is the host the daemons' ports listen on: the proxy's own
// listen host.
func (p *proxy) listenHost() string {
	h, _, _ := net.SplitHostPort(p.ln.Addr().String())
	return h
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// proxyListener is a device daemon's side of kiln proxy: a net.Listener
// whose connections are the client connections the proxy carries, each
// dialled out to the proxy when it asks. When the control connection
// breaks (the proxy restarted, the network went away), it connects again
// with a backoff (proxyRetryMin doubling to proxyRetryMax, for at most
// proxyRetryFor), asking for the port it had, and serves on.
type proxyListener struct {
	addr   string // the proxy's address
	token  string
	key    string
	public net.Addr // the address the proxy opened for this daemon
	// tracker is the proxy's tracker ("" when it has none).
	tracker string
	log     *slog.Logger
	conns   chan net.Conn
	done    chan struct{}
	once    sync.Once
	err     error

	mu  sync.Mutex
	ctl net.Conn // the current control connection
}

// The daemon's reconnection to a proxy that went away.
var (
	proxyRetryMin = 100 * time.Millisecond
	proxyRetryMax = 10 * time.Second
	proxyRetryFor = time.Hour
	// proxyMovedTries is how many times the daemon asks a proxy that gives
	// it another port than its own again before it stops.
	proxyMovedTries = 5
)

// dialProxy connects a daemon serving key to the proxy at addr. log
// receives the reconnections (nil: slog.Default()).
func dialProxy(ctx context.Context, addr, token, key string, log *slog.Logger) (*proxyListener, error) {
	if strings.ContainsAny(token+key, " \t\n") || token == "" {
		return nil, errors.New("rpcserver --proxy: the token must be set (--token-file) and neither it nor --key may hold spaces")
	}
	if log == nil {
		log = slog.Default()
	}
	ctl, public, tracker, err := dialBoard(ctx, addr, token, key, "")
	if err != nil {
		return nil, err
	}
	l := &proxyListener{addr: addr, token: token, key: key, public: proxyAddr(public), tracker: tracker, log: log,
		ctl: ctl, conns: make(chan net.Conn), done: make(chan struct{})}
	go l.readControl(ctl)
	return l, nil
}

// dialBoard opens a control connection to the proxy at addr, asking for
// the port of the address want when it is set (the one a reconnecting
// daemon had), and returns it with the address and tracker the proxy
// gave.
func dialBoard(ctx context.Context, addr, token, key, want string) (ctl net.Conn, public, tracker string, err error) {
	var d net.Dialer
	ctl, err = d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, "", "", fmt.Errorf("rpcserver --proxy %s: %w", addr, err)
	}
	line := fmt.Sprintf("%s board %s %s", proxyMagic, token, key)
	if want != "" {
		if _, port, err := net.SplitHostPort(want); err == nil {
			line += " " + port
		}
	}
	fmt.Fprintf(ctl, "%s\n", line)
	ctl.SetReadDeadline(time.Now().Add(proxyDialBack))
	reply, err := readLine(ctl)
	ctl.SetReadDeadline(time.Time{})
	if err != nil {
		ctl.Close()
		return nil, "", "", fmt.Errorf("rpcserver --proxy %s: no answer: %w", addr, err)
	}
	f := strings.Fields(reply)
	if len(f) < 2 || f[0] != "ok" {
		ctl.Close()
		return nil, "", "", fmt.Errorf("rpcserver --proxy %s refused the daemon: %s", addr, strings.TrimPrefix(reply, "error "))
	}
	if len(f) > 2 {
		tracker = f[2]
	}
	return ctl, f[1], tracker, nil
}

// proxyAddr is a net.Addr of the address the proxy gave (a host name
// stays a name).
type proxyAddr string

func (a proxyAddr) Network() string { return "tcp" }
func (a proxyAddr) String() string  { return string(a) }

// readControl dials back for each "dial ID" the proxy sends on ctl, and
// connects again when ctl breaks.
func (l *proxyListener) readControl(ctl net.Conn) {
	for {
		line, err := readLine(ctl)
		if err != nil {
			ctl.Close()
			select {
			case <-l.done:
				return
			default:
			}
			if ctl = l.reconnect(err); ctl == nil {
				return
			}
			continue
		}
		f := strings.Fields(line)
		if len(f) != 2 || f[0] != "dial" {
			continue
		}
		go l.dialBack(f[1])
	}
}

// reconnect connects to the proxy again after the control connection
// broke with cause, with a backoff, and returns the new control
// connection; nil when the listener was closed or gave up (then Accept
// fails with the reason).
func (l *proxyListener) reconnect(cause error) net.Conn {
	l.log.Warn("lost the kiln proxy: connecting again", "proxy", l.addr, "err", cause)
	start := time.Now()
	wait := proxyRetryMin
	moved := 0
	for attempt := 1; ; attempt++ {
		select {
		case <-l.done:
			return nil
		case <-time.After(wait):
		}
		ctx, cancel := context.WithTimeout(context.Background(), proxyDialBack)
		ctl, public, _, err := dialBoard(ctx, l.addr, l.token, l.key, l.public.String())
		cancel()
		if err == nil && public != l.public.String() {
			// The old port may still be held by the proxy's end of the
			// connection that broke: ask again a few times.
			ctl.Close()
			if moved++; moved == proxyMovedTries {
				l.fail(fmt.Errorf("rpcserver --proxy %s: the proxy came back with the port %s for this daemon, not %s (taken): clients and the tracker know the old one; restart the daemon", l.addr, public, l.public))
				return nil
			}
			err = fmt.Errorf("the proxy gave the port %s, not %s", public, l.public)
		}
		if err == nil {
			l.mu.Lock()
			select {
			case <-l.done:
				l.mu.Unlock()
				ctl.Close()
				return nil
			default:
			}
			l.ctl = ctl
			l.mu.Unlock()
			l.log.Info("connected to the kiln proxy again", "proxy", l.addr, "public", public, "attempts", attempt)
			return ctl
		}
		if time.Since(start) > proxyRetryFor {
			l.fail(fmt.Errorf("rpcserver --proxy %s: gave up after %d attempts in %s: %w", l.addr, attempt, time.Since(start).Round(time.Second), err))
			return nil
		}
		wait = min(2*wait, proxyRetryMax)
		l.log.Warn("kiln proxy unreachable", "proxy", l.addr, "attempt", attempt, "retry_in", wait, "err", err)
	}
}

func (l *proxyListener) dialBack(id string) {
	nc, err := net.DialTimeout("tcp", l.addr, proxyDialBack)
	if err != nil {
		return
	}
	if _, err := fmt.Fprintf(nc, "%s conn %s %s\n", proxyMagic, l.token, id); err != nil {
		nc.Close()
		return
	}
	select {
	case l.conns <- nc:
	case <-l.done:
		nc.Close()
	}
}

func (l *proxyListener) fail(err error) {
	l.once.Do(func() {
		l.mu.Lock()
		l.err = err
		close(l.done)
		l.ctl.Close()
		l.mu.Unlock()
	})
}

// Accept returns the next client connection the proxy carries.
func (l *proxyListener) Accept() (net.Conn, error) {
	select {
	case nc := <-l.conns:
		return nc, nil
	case <-l.done:
		if errors.Is(l.err, net.ErrClosed) {
			return nil, net.ErrClosed
		}
		return nil, l.err
	}
}

// Close leaves the proxy.
func (l *proxyListener) Close() error {
	l.fail(net.ErrClosed)
	return nil
}

// Addr is the address the proxy opened for the daemon: the one clients
// dial and the tracker is told.
func (l *proxyListener) Addr() net.Addr { return l.public }
