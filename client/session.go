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
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kiln-ml/kiln/devices"
	"github.com/kiln-ml/kiln/ndarray"
	"github.com/kiln-ml/kiln/rpcserver/proto"
	"github.com/kiln-ml/kiln/rpcserver/timer"
)

// Wire types the session API uses as they are.
type (
	// TimeOptions are the time evaluator's parameters (TVM's names).
	TimeOptions = proto.TimeOptions
	// TimeResult is what the time evaluator measured, in seconds per call.
	TimeResult = proto.TimeResult
	// FileInfo describes a file of the session's directory.
	FileInfo = proto.FileInfo
	// DeviceAttrs describes a daemon's host and devices.
	DeviceAttrs = proto.DeviceAttrsResult
	// SessionInfo describes an open session.
	SessionInfo = proto.SessionInfo
)

// SessionOptions configures Connect.
type SessionOptions struct {
	// Token is the daemon's listener token. A client with a lease need
	// not give it: its hellos carry LeaseToken whenever it is set, which a
	// daemon registered with the tracker admits in its place.
	Token string
	// TLS, when set, dials with TLS (see proto.TLSConfig.Client).
	TLS *tls.Config
	// LeaseToken is the token of the tracker lease on this device
	// (Lease.Token), when the daemon is registered with a tracker.
	LeaseToken string
	// Timeout, when positive, asks the daemon to end the session (and free
	// the device) once it has lasted that long, if that is sooner than its
	// own limit.
	Timeout time.Duration
	// HandshakeTimeout bounds the hello (proto's default when 0).
	HandshakeTimeout time.Duration
	// Logger receives debug logs (slog.Default() when nil).
	Logger *slog.Logger
}

// Session is an open session on a device daemon. Its methods are safe for
// concurrent use. Handles (Module, Func, Array) belong to their session.
type Session struct {
	c *proto.Client
	// calls, when set, is the session's call connection, served by the
	// worker itself (see proto.SessionInfo.CallTicket): the methods the
	// worker serves go there, one hop instead of two.
	calls *proto.Client
	info  SessionInfo
	addr  string
	opts  SessionOptions

	// noLinkCached says the daemon predates proto.FileLinkCached;
	// linkedBytes counts the bytes it linked in place of uploads.
	noLinkCached atomic.Bool
	linkedBytes  atomic.Int64

	mu     sync.Mutex
	endErr error // set once the daemon said the session ended
}

// helloToken is the token the hellos carry: the lease token, which a
// daemon registered with a tracker takes (the lease names the user; no
// fleet token is needed, and such a daemon may refuse the fleet token),
// else the daemon's token.
func (o SessionOptions) helloToken() string {
	if o.LeaseToken != "" {
		return o.LeaseToken
	}
	return o.Token
}

// Connect dials the device daemon at addr and opens a session. A device in
// another exclusive session refuses with an error wrapping proto.ErrBusy; a
// wrong token gives proto.ErrUnauthorized.
func Connect(ctx context.Context, addr string, opts SessionOptions) (*Session, error) {
	s, err := connect(ctx, addr, opts)
	// A lease can be granted a moment before the daemon has let go of the
	// previous session: with a lease token, a busy device is asked again
	// for a short while.
	for wait := 20 * time.Millisecond; err != nil && opts.LeaseToken != "" && errors.Is(err, proto.ErrBusy) && wait < 2*time.Second; wait *= 2 {
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(wait):
		}
		s, err = connect(ctx, addr, opts)
	}
	return s, err
}

func connect(ctx context.Context, addr string, opts SessionOptions) (*Session, error) {
	c, err := proto.Dial(ctx, addr, proto.DialOptions{
		Role: proto.RoleClient, Token: opts.helloToken(), TLS: opts.TLS,
		HandshakeTimeout: opts.HandshakeTimeout, Logger: opts.Logger, Expect: proto.ListenerDevice,
	})
	if err != nil {
		return nil, fmt.Errorf("connect to device %s: %w", addr, err)
	}
	s := &Session{c: c, addr: addr, opts: opts}
	if err := c.Call(ctx, proto.SessionOpen, proto.OpenArgs{LeaseToken: opts.LeaseToken, Timeout: opts.Timeout}, &s.info); err != nil {
		c.Close()
		return nil, fmt.Errorf("open session on %s: %w", addr, err)
	}
	if s.info.CallTicket != "" && opts.TLS == nil {
		calls, err := s.dialCalls(ctx)
		if err != nil {
			// The session's connection carries the calls instead.
			s.log().Debug("no call connection: calls go through the daemon", "addr", addr, "err", err)
		}
		s.calls = calls
	}
	return s, nil
}

func (s *Session) log() *slog.Logger {
	if s.opts.Logger != nil {
		return s.opts.Logger
	}
	return slog.Default()
}

// dialCalls opens the session's call connection: a RoleCall connection
// carrying the session's call ticket, which the daemon hands to the
// worker; the worker's answer says it serves the connection from now on.
func (s *Session) dialCalls(ctx context.Context) (*proto.Client, error) {
	opts := proto.DialOptions{Role: proto.RoleCall, Token: s.opts.helloToken(), HandshakeTimeout: s.opts.HandshakeTimeout, Logger: s.opts.Logger}
	nc, err := proto.DialRaw(ctx, s.addr, opts)
	if err != nil {
		return nil, err
	}
	deadline := time.Now().Add(proto.DefaultHandshakeTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	nc.SetDeadline(deadline)
	stop := context.AfterFunc(ctx, func() { nc.SetDeadline(time.Unix(1, 0)) })
	err = proto.WriteFrame(nc, proto.CallTicket{Ticket: s.info.CallTicket}, 0)
	var b []byte
	if err == nil {
		b, err = proto.ReadFrame(nc, 64<<10)
	}
	var resp proto.Response
	if err == nil {
		resp, err = proto.DecodeResponse(b)
	}
	if err == nil && resp.Error != nil {
		err = resp.Error
	}
	if !stop() && err == nil {
		err = ctx.Err()
	}
	if err == nil {
		err = nc.SetDeadline(time.Time{})
	}
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("call connection: %w", err)
	}
	return proto.NewAdoptedFrameClient(nc, opts), nil
}

// workerMethods are the methods the session's worker serves, which go on
// the call connection when there is one.
var workerMethods = map[string]bool{
	proto.ModuleLoad: true, proto.ModuleGetFunction: true, proto.GlobalGet: true, proto.GlobalList: true,
	proto.FuncCall: true, proto.FuncTime: true, proto.ArrayEmpty: true, proto.HandleFree: true, proto.DeviceAttrs: true,
}

// Info describes the session (id, worker pid, expiry).
func (s *Session) Info() SessionInfo { return s.info }

// Expires is when the daemon ends the session.
func (s *Session) Expires() time.Time { return time.Unix(0, s.info.ExpiresAt) }

// Close ends the session: the daemon frees the device, stops its worker
// and removes its files before Close returns, so the next session on an
// exclusive device finds it free. It is idempotent.
func (s *Session) Close() error {
	if s.calls != nil {
		s.calls.Close()
	}
	// A daemon too old for session.close, or one already gone, answers at
	// once; closing the connection ends the session in any case.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	_ = s.c.Call(ctx, proto.SessionClose, nil, nil)
	cancel()
	return s.c.Close()
}

// Done is closed when the session's connection to the daemon ends (the
// session closed, or the daemon or the network went away).
func (s *Session) Done() <-chan struct{} { return s.c.Done() }

// Err returns why the session ended (crashed, expired, connection lost), or
// nil while it is usable.
func (s *Session) Err() error {
	s.mu.Lock()
	err := s.endErr
	s.mu.Unlock()
	if err != nil {
		return err
	}
	if cerr := s.c.Err(); cerr != nil {
		return s.explain(cerr)
	}
	return nil
}

// explain records an error that ends the session and turns a lost
// connection past the deadline into ErrSessionExpired.
func (s *Session) explain(err error) error {
	if err == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case errors.Is(err, proto.ErrCrashed) || errors.Is(err, proto.ErrSessionExpired):
		if s.endErr == nil {
			s.endErr = err
		}
	case errors.Is(err, proto.ErrUnavailable):
		if s.endErr != nil {
			return fmt.Errorf("%w (then the daemon closed the connection)", s.endErr)
		}
		if s.info.ExpiresAt != 0 && time.Now().UnixNano() >= s.info.ExpiresAt {
			return fmt.Errorf("session %s expired at %s: %w (%w)", s.info.ID, s.Expires().Format(time.RFC3339), proto.ErrSessionExpired, err)
		}
	}
	return err
}

// ended returns the recorded end of the session, for calls made after it.
func (s *Session) ended() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.endErr
}

// call runs a method, keeping the session's end in mind.
func (s *Session) call(ctx context.Context, method string, args, result any) error {
	if err := s.ended(); err != nil {
		return err
	}
	if s.calls != nil && workerMethods[method] {
		err := s.calls.Call(ctx, method, args, result)
		if err != nil && errors.Is(err, proto.ErrUnavailable) {
			err = s.whyBroken(ctx, err)
		}
		return s.explain(err)
	}
	return s.explain(s.c.Call(ctx, method, args, result))
}

// whyBroken asks the daemon why the call connection broke: a worker that
// died (a crashed kernel, a session past its deadline) takes it down, and
// the daemon, which saw it die, says how and in which function.
func (s *Session) whyBroken(ctx context.Context, err error) error {
	qctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	why := s.c.Call(qctx, proto.SessionStatus, nil, nil)
	var we *proto.WireError
	if why != nil && !errors.Is(why, proto.ErrUnavailable) && !errors.Is(why, proto.ErrNotFound) && errors.As(why, &we) {
		return we
	}
	return err
}

// bulk runs a bulk method.
func (s *Session) bulk(ctx context.Context, method string, in proto.Bulk, w io.Writer) (int64, error) {
	if err := s.ended(); err != nil {
		return 0, err
	}
	n, err := s.c.Bulk(ctx, method, in, w)
	return n, s.explain(err)
}

// Upload stores data as the file name in the session's directory.
func (s *Session) Upload(ctx context.Context, name string, data []byte) error {
	return s.UploadFrom(ctx, name, int64(len(data)), bytesReader(data))
}

// UploadFrom stores size bytes of r as the file name.
// Files of rawUploadMin bytes or more go on a connection of their own
// (proto.FileUploadTicket), smaller ones on the session's connection.
// Of such a file, when r is a byte slice's reader or an io.Seeker, the
// client first sends the SHA-256 (proto.FileLinkCached): a daemon that
// kept the same bytes from an earlier upload links them in place and
// nothing is sent; otherwise the bytes go, with the digest for the daemon
// to check and keep.
const rawUploadMin = 1 << 20

func (s *Session) UploadFrom(ctx context.Context, name string, size int64, r io.Reader) error {
	if size >= rawUploadMin {
		sum, err := contentSum(r, size)
		if err != nil {
			return fmt.Errorf("upload %q: %w", name, err)
		}
		if sum != "" {
			linked, err := s.linkCached(ctx, name, size, sum)
			if err != nil {
				return fmt.Errorf("upload %q: %w", name, err)
			}
			if linked {
				return nil
			}
		}
		err = s.rawUpload(ctx, name, size, r, sum)
		if !errors.Is(err, errNoRawUpload) {
			if err != nil {
				return fmt.Errorf("upload %q: %w", name, err)
			}
			return nil
		}
	}
	if _, err := s.bulk(ctx, proto.FileUpload, proto.Bulk{Name: name, Size: size, Body: r}, nil); err != nil {
		return fmt.Errorf("upload %q: %w", name, err)
	}
	return nil
}

// contentSum is the hex SHA-256 of the size bytes r yields, read from a
// byte slice, or from a seeker that is then put back; "" for a reader
// that cannot be read twice.
func contentSum(r io.Reader, size int64) (string, error) {
	h := sha256.New()
	switch r := r.(type) {
	case *sliceReader:
		if int64(len(r.b)) != size {
			return "", nil
		}
		h.Write(r.b)
	case io.ReadSeeker:
		at, err := r.Seek(0, io.SeekCurrent)
		if err != nil {
			return "", nil // a pipe, say: not seekable after all
		}
		n, err := io.CopyN(h, r, size)
		if _, serr := r.Seek(at, io.SeekStart); serr != nil {
			return "", fmt.Errorf("rewind after the digest: %w", serr)
		}
		if err != nil || n != size {
			return "", nil // the upload itself says what is short
		}
	default:
		return "", nil
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// linkCached asks the daemon to link a file it keeps with digest sum into
// place as name. A daemon that predates the method answers not found,
// after which the session asks no more.
func (s *Session) linkCached(ctx context.Context, name string, size int64, sum string) (bool, error) {
	if s.noLinkCached.Load() {
		return false, nil
	}
	var out proto.LinkCached
	err := s.call(ctx, proto.FileLinkCached, proto.LinkCachedArgs{Name: name, Size: size, SHA256: sum}, &out)
	if errors.Is(err, proto.ErrNotFound) {
		s.noLinkCached.Store(true)
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if out.Linked {
		s.linkedBytes.Add(size)
	}
	return out.Linked, nil
}

// LinkedBytes is how many bytes of this session's uploads the daemon
// linked from files it kept, rather than receiving them.
func (s *Session) LinkedBytes() int64 { return s.linkedBytes.Load() }

// errNoRawUpload says the daemon predates uploads on their own
// connections: the session's connection carries the file instead.
var errNoRawUpload = errors.New("the daemon takes no uploads on connections of their own")

// rawUpload sends the file on a connection of its own: a ticket from the
// session, then a RoleBulk connection carrying the ticket, the bytes, and
// the daemon's answer. Nothing multiplexes that connection, so the bytes
// move at the socket's speed (sendfile from a file).
func (s *Session) rawUpload(ctx context.Context, name string, size int64, r io.Reader, sum string) error {
	var t proto.UploadTicket
	if err := s.call(ctx, proto.FileUploadTicket, proto.UploadTicketArgs{Name: name, Size: size, SHA256: sum}, &t); err != nil {
		if errors.Is(err, proto.ErrNotFound) {
			return errNoRawUpload
		}
		return err
	}
	nc, err := proto.DialRaw(ctx, s.addr, proto.DialOptions{
		Role: proto.RoleBulk, Token: s.opts.helloToken(), TLS: s.opts.TLS, HandshakeTimeout: s.opts.HandshakeTimeout, Logger: s.opts.Logger,
	})
	if err != nil {
		return err
	}
	defer nc.Close()
	stop := context.AfterFunc(ctx, func() { nc.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	if err := proto.WriteFrame(nc, proto.BulkTicket{Ticket: t.Ticket}, 0); err != nil {
		return s.rawErr(ctx, err)
	}
	if sr, ok := r.(*sliceReader); ok && int64(len(sr.b)) == size {
		_, err = nc.Write(sr.b)
	} else {
		_, err = io.CopyN(nc, r, size)
	}
	// The daemon answers once it has the bytes, or as soon as it refuses
	// them (a quota, say): after a broken write its answer may still be
	// there to read.
	b, rerr := proto.ReadFrame(nc, 0)
	if rerr == nil {
		resp, derr := proto.DecodeResponse(b)
		if derr != nil {
			return derr
		}
		if resp.Error != nil {
			return s.explain(resp.Error)
		}
	}
	if err != nil {
		return s.rawErr(ctx, err)
	}
	if rerr != nil {
		return s.rawErr(ctx, rerr)
	}
	return nil
}

// rawErr is the error of a broken upload connection: the context's, or
// the connection's as unavailable.
func (s *Session) rawErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("upload connection: %w", ctx.Err())
	}
	return s.explain(fmt.Errorf("upload connection: %v: %w", err, proto.ErrUnavailable))
}

// UploadFile stores the local file path as the file name.
func (s *Session) UploadFile(ctx context.Context, name, path string) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("upload %q: %w", name, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return fmt.Errorf("upload %q: %w", name, err)
	}
	return s.UploadFrom(ctx, name, fi.Size(), f)
}

// Download copies the file name to w.
func (s *Session) Download(ctx context.Context, name string, w io.Writer) (int64, error) {
	n, err := s.bulk(ctx, proto.FileDownload, proto.Bulk{Name: name}, w)
	if err != nil {
		return n, fmt.Errorf("download %q: %w", name, err)
	}
	return n, nil
}

// Remove removes the file name.
func (s *Session) Remove(ctx context.Context, name string) error {
	if err := s.call(ctx, proto.FileRemove, proto.FileArgs{Name: name}, nil); err != nil {
		return fmt.Errorf("remove %q: %w", name, err)
	}
	return nil
}

// List lists the session's files.
func (s *Session) List(ctx context.Context) ([]FileInfo, error) {
	var out []FileInfo
	if err := s.call(ctx, proto.FileList, nil, &out); err != nil {
		return nil, fmt.Errorf("list files: %w", err)
	}
	return out, nil
}

// Module is a module loaded in the session.
type Module struct {
	s         *Session
	Handle    uint64
	Type      string
	Functions []string
}

// LoadModule loads the file name (uploaded before: a .kiln artifact or a
// shared object) in the session's worker. An artifact with a VM executable
// (a graph-level module) loads as a VM whose functions are the graph
// functions; memoryCfg, when given, picks its allocator ("pooled" or
// "naive").
func (s *Session) LoadModule(ctx context.Context, name string, memoryCfg ...string) (*Module, error) {
	args := proto.ModuleLoadArgs{Name: name}
	if len(memoryCfg) > 0 {
		args.MemoryCfg = memoryCfg[0]
	}
	var mi proto.ModuleInfo
	if err := s.call(ctx, proto.ModuleLoad, args, &mi); err != nil {
		return nil, fmt.Errorf("load module %q: %w", name, err)
	}
	return &Module{s: s, Handle: mi.Handle, Type: mi.Type, Functions: mi.Functions}, nil
}

// GetFunction looks a function of the module up.
func (m *Module) GetFunction(ctx context.Context, name string) (*Func, error) {
	return m.s.getFunction(ctx, proto.ModuleGetFunction, m.Handle, name)
}

// Free unloads the module once its functions' calls in flight return.
func (m *Module) Free(ctx context.Context) error { return m.s.free(ctx, m.Handle) }

// Func is a remote function.
type Func struct {
	s      *Session
	Handle uint64
	Name   string
}

// GetGlobal looks a global function of the worker's registry up.
func (s *Session) GetGlobal(ctx context.Context, name string) (*Func, error) {
	return s.getFunction(ctx, proto.GlobalGet, 0, name)
}

func (s *Session) getFunction(ctx context.Context, method string, module uint64, name string) (*Func, error) {
	var fi proto.FuncInfo
	if err := s.call(ctx, method, proto.GetFunctionArgs{Module: module, Name: name}, &fi); err != nil {
		return nil, fmt.Errorf("get function %q: %w", name, err)
	}
	return &Func{s: s, Handle: fi.Handle, Name: fi.Name}, nil
}

// ListGlobals lists the worker's global functions.
func (s *Session) ListGlobals(ctx context.Context) ([]string, error) {
	var out []string
	if err := s.call(ctx, proto.GlobalList, nil, &out); err != nil {
		return nil, fmt.Errorf("list global functions: %w", err)
	}
	return out, nil
}

// Call calls f with args; see Session.Call.
func (f *Func) Call(ctx context.Context, args ...any) (any, error) { return f.s.Call(ctx, f, args...) }

// Free releases the function handle.
func (f *Func) Free(ctx context.Context) error { return f.s.free(ctx, f.Handle) }

// Call calls f remotely. Arguments may be *Array, *Func, *Module, integers,
// floats, bools (as 0 or 1), strings, []byte, ndarray.Shape, ndarray.DType,
// devices.Device, or nil. The result is nil, int64, float64, string, []byte,
// ndarray.Shape, ndarray.DType, devices.Device, *Array, *Func or *Module.
func (s *Session) Call(ctx context.Context, f *Func, args ...any) (any, error) {
	wargs, err := toWire(args)
	if err != nil {
		return nil, fmt.Errorf("call %q: %w", f.Name, err)
	}
	var out proto.Value
	if err := s.call(ctx, proto.FuncCall, proto.CallArgs{Func: f.Handle, Args: wargs}, &out); err != nil {
		return nil, fmt.Errorf("call %q: %w", f.Name, remoteError(err, proto.FuncCall))
	}
	return s.fromWire(out)
}

// remoteError is the device's own answer when err is one to a call of
// method (which runs a function): the device says what went wrong in the
// function, and the caller names the function once, not the method too.
// Any other error is err.
func remoteError(err error, method string) error {
	if ce, ok := err.(*proto.CallError); ok && ce.Method == method {
		return ce.Err
	}
	return err
}

// TimeEvaluator times f called with args on the device, following TVM's
// time_evaluator (one warm-up call; Number grows until a measurement lasts
// MinRepeatMS; Repeat results in seconds per call). The result's Report
// says whether the figures can be trusted: the spread, the device's state
// while they were measured, and the verdict ("stable" when the median's
// 95% confidence interval is within o.StableWithin, ±2% by default, else
// "noisy" and why); at least timer.MinSamples repeats are needed for
// "stable".
func (s *Session) TimeEvaluator(ctx context.Context, f *Func, o TimeOptions, args ...any) (TimeResult, error) {
	wargs, err := toWire(args)
	if err != nil {
		return TimeResult{}, fmt.Errorf("time %q: %w", f.Name, err)
	}
	var r TimeResult
	if err := s.call(ctx, proto.FuncTime, proto.TimeArgs{Func: f.Handle, Args: wargs, Options: o}, &r); err != nil {
		return TimeResult{}, fmt.Errorf("time %q: %w", f.Name, remoteError(err, proto.FuncTime))
	}
	if r.Report == nil {
		// A daemon that predates the validity report: the results are
		// assessed here, without the machine's state.
		rep := timer.Assess(r.Results, proto.MachineState{Emulated: r.Emulated, Unread: []string{"machine state (the device's daemon does not report it)"}}, o.StableWithin)
		r.Report = &rep
	}
	return r, nil
}

// DeviceAttrs describes the daemon's host and devices.
func (s *Session) DeviceAttrs(ctx context.Context) (DeviceAttrs, error) {
	var r DeviceAttrs
	if err := s.call(ctx, proto.DeviceAttrs, nil, &r); err != nil {
		return DeviceAttrs{}, fmt.Errorf("device attributes: %w", err)
	}
	return r, nil
}

func (s *Session) free(ctx context.Context, h uint64) error {
	if err := s.call(ctx, proto.HandleFree, proto.HandleArgs{Handle: h}, nil); err != nil {
		return fmt.Errorf("free handle %d: %w", h, err)
	}
	return nil
}

// Array is an array in the session's worker.
type Array struct {
	s      *Session
	Handle uint64
	Shape  ndarray.Shape
	DType  ndarray.DType
	Device devices.Device
	// Bytes is the size of its compact contents.
	Bytes int64
}

// Empty allocates an uninitialized array on the device.
func (s *Session) Empty(ctx context.Context, shape ndarray.Shape, dtype ndarray.DType, dev devices.Device) (*Array, error) {
	var ai proto.ArrayInfo
	args := proto.EmptyArgs{Shape: shape, DType: dtype.String(), Device: dev.String()}
	if err := s.call(ctx, proto.ArrayEmpty, args, &ai); err != nil {
		return nil, fmt.Errorf("empty %v %s on %s: %w", shape, dtype, dev, err)
	}
	return s.array(ai)
}

func (s *Session) array(ai proto.ArrayInfo) (*Array, error) {
	dt, err := ndarray.ParseDType(ai.DType)
	if err != nil {
		return nil, fmt.Errorf("array %d: %v: %w", ai.Handle, err, proto.ErrBadRequest)
	}
	dev, err := devices.ParseDevice(ai.Device)
	if err != nil {
		return nil, fmt.Errorf("array %d: %v: %w", ai.Handle, err, proto.ErrBadRequest)
	}
	return &Array{s: s, Handle: ai.Handle, Shape: ndarray.Shape(ai.Shape), DType: dt, Device: dev, Bytes: ai.Bytes}, nil
}

// CopyFrom fills the remote array from src (same shape and dtype).
func (s *Session) CopyFrom(ctx context.Context, dst *Array, src *ndarray.NDArray) error {
	if !src.Shape().Equal(dst.Shape) || src.DType() != dst.DType {
		return fmt.Errorf("copy to array %d: source is %v %s, the array is %v %s: %w", dst.Handle, src.Shape(), src.DType(), dst.Shape, dst.DType, proto.ErrBadRequest)
	}
	b, err := src.Bytes()
	if err != nil {
		return fmt.Errorf("copy to array %d: %w", dst.Handle, err)
	}
	return dst.CopyFromBytes(ctx, b)
}

// CopyTo returns a CPU copy of the remote array.
func (s *Session) CopyTo(ctx context.Context, src *Array) (*ndarray.NDArray, error) {
	b, err := src.ReadBytes(ctx)
	if err != nil {
		return nil, err
	}
	out, err := ndarray.FromBytes(b, src.Shape, src.DType, devices.CPUDevice)
	if err != nil {
		return nil, fmt.Errorf("copy from array %d: %w", src.Handle, err)
	}
	return out, nil
}

// CopyFromBytes fills the array with exactly a.Bytes compact row-major bytes.
func (a *Array) CopyFromBytes(ctx context.Context, b []byte) error {
	if int64(len(b)) != a.Bytes {
		return fmt.Errorf("copy to array %d: %d bytes given, the array holds %d: %w", a.Handle, len(b), a.Bytes, proto.ErrBadRequest)
	}
	return a.CopyFromReader(ctx, bytesReader(b))
}

// CopyFromReader fills the array with a.Bytes bytes read from r.
func (a *Array) CopyFromReader(ctx context.Context, r io.Reader) error {
	name := strconv.FormatUint(a.Handle, 10)
	if _, err := a.s.bulk(ctx, proto.ArrayCopyFrom, proto.Bulk{Name: name, Size: a.Bytes, Body: r}, nil); err != nil {
		return fmt.Errorf("copy to array %d: %w", a.Handle, err)
	}
	return nil
}

// CopyTo writes the array's compact row-major bytes to w.
func (a *Array) CopyTo(ctx context.Context, w io.Writer) (int64, error) {
	name := strconv.FormatUint(a.Handle, 10)
	n, err := a.s.bulk(ctx, proto.ArrayCopyTo, proto.Bulk{Name: name}, w)
	if err != nil {
		return n, fmt.Errorf("copy from array %d: %w", a.Handle, err)
	}
	return n, nil
}

// ReadBytes returns the array's compact row-major bytes.
func (a *Array) ReadBytes(ctx context.Context) ([]byte, error) {
	buf := &fixedBuffer{b: make([]byte, 0, a.Bytes)}
	if _, err := a.CopyTo(ctx, buf); err != nil {
		return nil, err
	}
	return buf.b, nil
}

// Free releases the array once calls in flight that use it return.
func (a *Array) Free(ctx context.Context) error { return a.s.free(ctx, a.Handle) }

// String describes the array.
func (a *Array) String() string {
	return fmt.Sprintf("remote array %d %v %s on %s", a.Handle, a.Shape, a.DType, a.Device)
}

// fixedBuffer appends to a preallocated slice.
type fixedBuffer struct{ b []byte }

func (f *fixedBuffer) Write(p []byte) (int, error) {
	f.b = append(f.b, p...)
	return len(p), nil
}

// bytesReader reads a byte slice (nil for an empty one, as proto wants).
func bytesReader(b []byte) io.Reader {
	if len(b) == 0 {
		return nil
	}
	return &sliceReader{b: b}
}

type sliceReader struct{ b []byte }

func (r *sliceReader) Read(p []byte) (int, error) {
	if len(r.b) == 0 {
		return 0, io.EOF
	}
	n := copy(p, r.b)
	r.b = r.b[n:]
	return n, nil
}

// toWire converts call arguments.
func toWire(args []any) ([]proto.Value, error) {
	out := make([]proto.Value, len(args))
	for i, a := range args {
		v, err := valueOf(a)
		if err != nil {
			return nil, fmt.Errorf("argument %d: %w", i, err)
		}
		out[i] = v
	}
	return out, nil
}

func valueOf(a any) (proto.Value, error) {
	switch v := a.(type) {
	case nil:
		return proto.Value{Kind: proto.KindNil}, nil
	case proto.Value:
		return v, nil
	case *Array:
		return proto.Value{Kind: proto.KindArray, Handle: v.Handle}, nil
	case *Func:
		return proto.Value{Kind: proto.KindFunc, Handle: v.Handle}, nil
	case *Module:
		return proto.Value{Kind: proto.KindModule, Handle: v.Handle}, nil
	case bool:
		n := int64(0)
		if v {
			n = 1
		}
		return proto.Value{Kind: proto.KindInt, Int: n}, nil
	case int:
		return proto.Value{Kind: proto.KindInt, Int: int64(v)}, nil
	case int8:
		return proto.Value{Kind: proto.KindInt, Int: int64(v)}, nil
	case int16:
		return proto.Value{Kind: proto.KindInt, Int: int64(v)}, nil
	case int32:
		return proto.Value{Kind: proto.KindInt, Int: int64(v)}, nil
	case int64:
		return proto.Value{Kind: proto.KindInt, Int: v}, nil
	case uint8:
		return proto.Value{Kind: proto.KindInt, Int: int64(v)}, nil
	case uint16:
		return proto.Value{Kind: proto.KindInt, Int: int64(v)}, nil
	case uint32:
		return proto.Value{Kind: proto.KindInt, Int: int64(v)}, nil
	case float32:
		return proto.Value{Kind: proto.KindFloat, Float: float64(v)}, nil
	case float64:
		return proto.Value{Kind: proto.KindFloat, Float: v}, nil
	case string:
		return proto.Value{Kind: proto.KindString, Str: v}, nil
	case []byte:
		return proto.Value{Kind: proto.KindBytes, Bytes: v}, nil
	case ndarray.Shape:
		return proto.Value{Kind: proto.KindShape, Shape: v}, nil
	case ndarray.DType:
		return proto.Value{Kind: proto.KindDType, Str: v.String()}, nil
	case devices.Device:
		return proto.Value{Kind: proto.KindDevice, Str: v.String()}, nil
	}
	return proto.Value{}, fmt.Errorf("cannot pass a %T to a remote function: %w", a, proto.ErrBadRequest)
}

// fromWire converts a call's result.
func (s *Session) fromWire(v proto.Value) (any, error) {
	switch v.Kind {
	case proto.KindNil, "":
		return nil, nil
	case proto.KindInt:
		return v.Int, nil
	case proto.KindFloat:
		return v.Float, nil
	case proto.KindString:
		return v.Str, nil
	case proto.KindBytes:
		return v.Bytes, nil
	case proto.KindShape:
		return ndarray.Shape(v.Shape), nil
	case proto.KindDType:
		return ndarray.ParseDType(v.Str)
	case proto.KindDevice:
		return devices.ParseDevice(v.Str)
	case proto.KindArray:
		if v.Array == nil {
			return nil, fmt.Errorf("array result without its description: %w", proto.ErrBadRequest)
		}
		return s.array(*v.Array)
	case proto.KindFunc:
		name := ""
		if v.Func != nil {
			name = v.Func.Name
		}
		return &Func{s: s, Handle: v.Handle, Name: name}, nil
	case proto.KindTuple:
		out := make([]any, len(v.Fields))
		for i, f := range v.Fields {
			x, err := s.fromWire(f)
			if err != nil {
				return nil, fmt.Errorf("tuple field %d: %w", i, err)
			}
			out[i] = x
		}
		return out, nil
	case proto.KindModule:
		m := &Module{s: s, Handle: v.Handle}
		if v.Module != nil {
			m.Type, m.Functions = v.Module.Type, v.Module.Functions
		}
		return m, nil
	}
	return nil, fmt.Errorf("unknown result kind %q: %w", v.Kind, proto.ErrBadRequest)
}
