package main

/*
#include <stdlib.h>
#include "support.h"
*/
import "C"

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/kiln-ml/kiln/client"
	"github.com/kiln-ml/kiln/devices"
	"github.com/kiln-ml/kiln/load"
	"github.com/kiln-ml/kiln/packedfunc"
	"github.com/kiln-ml/kiln/rpcserver/globals"
	"github.com/kiln-ml/kiln/rpcserver/proto"
)

// freeTimeout bounds the remote calls that free handles and close sessions.
const freeTimeout = 5 * time.Second

// tracker is a connection to a tracker. One client.Tracker serves the
// handle for its whole life: a call cancelled midway (Ctrl-C in a waiting
// request or build) leaves its connection open, and a lost connection is
// dialled again by client.Tracker itself, so the leases of the sessions
// requested through the handle keep renewing. Those sessions hold the
// connection too: freeing the handle closes it only once the last of them
// has released its lease (TVM's scripts drop the TrackerSession right
// after request(), and the tracker frees a lease whose connection closes).
type tracker struct {
	addr string
	t    *client.Tracker

	mu    sync.Mutex
	users int // the handle and each live session requested through it
}

func (t *tracker) kind() string { return "tracker" }
func (t *tracker) free()        { t.unref() }

// ref counts one more user of the connection.
func (t *tracker) ref() {
	t.mu.Lock()
	t.users++
	t.mu.Unlock()
}

// unref drops a user; the last one closes the connection.
func (t *tracker) unref() {
	t.mu.Lock()
	t.users--
	last := t.users == 0
	t.mu.Unlock()
	if last {
		t.t.Close()
	}
}

func (t *tracker) client() *client.Tracker { return t.t }

//export kiln_tracker_connect
func kiln_tracker_connect(addr, token *C.char, cancel C.KilnHandle, out *C.KilnHandle) C.int {
	ctx, err := contextOf(cancel)
	if err != nil {
		return fail(err, errArgument)
	}
	if out == nil {
		return fail(badArg("no place for the tracker (NULL)"), errArgument)
	}
	a := gostr(addr)
	if _, err := client.ParseTrackerAddrs(a); err != nil {
		return fail(badArg("%v", err), errArgument)
	}
	tok := gostr(token)
	t, err := client.DialTracker(ctx, a, client.TrackerOptions{Token: tok})
	if err != nil {
		return fail(err, errTracker)
	}
	*out = newHandle(&tracker{t: t, addr: a, users: 1})
	return 0
}

func checkAddr(a string) error {
	if a == "" {
		return badArg("no address given (want HOST:PORT)")
	}
	if !strings.Contains(a, ":") {
		return badArg("address %q has no port (want HOST:PORT)", a)
	}
	return nil
}

//export kiln_tracker_summary
func kiln_tracker_summary(h C.KilnHandle, out **C.char) C.int {
	t, err := lookup[*tracker](h, "tracker")
	if err != nil {
		return fail(err, errArgument)
	}
	sum, err := t.client().Query(context.Background(), 20)
	if err != nil {
		return fail(fmt.Errorf("query tracker %s: %w", t.addr, err), errTracker)
	}
	b, err := json.Marshal(sum)
	if err != nil {
		return fail(err, errInternal)
	}
	return outString(out, string(b))
}

// knownKey fails when no device is registered under key, naming the keys
// the tracker knows: a mistyped key should not wait in a queue nobody
// serves.
func knownKey(ctx context.Context, t *client.Tracker, key string) error {
	sum, err := t.Query(ctx, 0)
	if err != nil {
		return err
	}
	var known []string
	for _, k := range sum.Keys {
		n := k.Free + k.Busy + k.Quarantined + k.Lost
		if k.Key == key && n > 0 {
			return nil
		}
		if n > 0 {
			known = append(known, fmt.Sprintf("%q", k.Key))
		}
	}
	have := "no device is registered at all"
	if len(known) > 0 {
		have = "registered keys: " + strings.Join(known, ", ")
	}
	return fmt.Errorf("no device is registered under key %q (%s); give a wait time to wait for one: %w", key, have, proto.ErrNotFound)
}

//export kiln_tracker_request
func kiln_tracker_request(h C.KilnHandle, key, selector *C.char, priority C.int32_t, sessionTimeout, wait C.double,
	progress C.KilnProgressFn, user unsafe.Pointer, cancel C.KilnHandle, out *C.KilnHandle) C.int {
	t, err := lookup[*tracker](h, "tracker")
	if err != nil {
		return fail(err, errArgument)
	}
	ctx, err := contextOf(cancel)
	if err != nil {
		return fail(err, errArgument)
	}
	if out == nil {
		return fail(badArg("no place for the session (NULL)"), errArgument)
	}
	k, sel := gostr(key), gostr(selector)
	if k == "" && sel == "" {
		return fail(badArg("request: give a device key or a selector"), errArgument)
	}
	if sessionTimeout < 0 || wait < 0 {
		return fail(badArg("request: negative session timeout or wait"), errArgument)
	}
	if k != "" && wait == 0 {
		if err := knownKey(ctx, t.client(), k); err != nil {
			return fail(fmt.Errorf("request %q: %w", k, err), errTracker)
		}
	}
	wctx, stop := ctx, context.CancelFunc(func() {})
	if wait > 0 {
		wctx, stop = context.WithTimeout(ctx, seconds(wait))
	}
	defer stop()
	req := client.LeaseRequest{
		Key: k, Selector: sel, Priority: int(priority), SessionTimeout: seconds(sessionTimeout), User: "kiln python",
		OnPosition: func(pos int, queue string) {
			say(progress, user, fmt.Sprintf("waiting for a device: position %d in queue %q", pos, queue))
		},
	}
	lease, err := t.client().RequestLease(wctx, req)
	if err != nil {
		return fail(err, errTracker)
	}
	// A device that cannot be reached (an address it advertises that
	// does not answer) is skipped: its lease is held while another device
	// is asked for, briefly, so the tracker does not grant it again.
	var unreachable []*client.Lease
	defer func() {
		rctx, cancelR := context.WithTimeout(context.Background(), freeTimeout)
		for _, l := range unreachable {
			l.Release(rctx)
		}
		cancelR()
	}()
	for {
		s, err := client.Connect(ctx, lease.Addr, client.SessionOptions{LeaseToken: lease.Token})
		if err == nil {
			t.ref()
			*out = newHandle(&remoteSession{s: s, lease: lease, tracker: t, addr: lease.Addr, key: lease.Key})
			return 0
		}
		unreachable = append(unreachable, lease)
		if len(unreachable) >= maxUnreachable || ctx.Err() != nil {
			return fail(err, errSession)
		}
		nctx, stopN := context.WithTimeout(wctx, otherDeviceWait)
		next, nerr := t.client().RequestLease(nctx, req)
		stopN()
		if nerr != nil {
			return fail(err, errSession)
		}
		lease = next
	}
}

// How many unreachable devices a request skips, and how long it waits for
// another device after one.
const (
	maxUnreachable  = 5
	otherDeviceWait = 5 * time.Second
)

func seconds(s C.double) time.Duration { return time.Duration(float64(s) * float64(time.Second)) }

// say passes a progress line to the caller's callback.
func say(fn C.KilnProgressFn, user unsafe.Pointer, line string) {
	if fn == nil {
		return
	}
	cs := C.CString(line)
	C.kiln_progress_call(fn, cs, user)
	C.free(unsafe.Pointer(cs))
}

// session is a remote or a local session.
type session interface {
	object
	upload(ctx context.Context, path, name string) error
	loadModule(ctx context.Context, name string) (object, error)
	info() map[string]any
}

// remoteSession is a session on a device daemon, with the lease it runs
// under when it came from a tracker.
type remoteSession struct {
	s       *client.Session
	lease   *client.Lease
	tracker *tracker // the connection the lease renews over (nil without a lease)
	addr    string
	key     string

	mu     sync.Mutex
	closed bool
}

func (r *remoteSession) kind() string { return "session" }

func (r *remoteSession) free() {
	r.mu.Lock()
	r.closed = true
	r.mu.Unlock()
	r.s.Close()
	if r.lease != nil {
		ctx, cancel := context.WithTimeout(context.Background(), freeTimeout)
		r.lease.Release(ctx)
		cancel()
	}
	if r.tracker != nil {
		r.tracker.unref()
	}
}

// check fails once the session was closed or has ended.
func (r *remoteSession) check() error {
	r.mu.Lock()
	closed := r.closed
	r.mu.Unlock()
	if closed {
		return fmt.Errorf("session on %s was closed", r.addr)
	}
	if err := r.s.Err(); err != nil {
		return fmt.Errorf("session on %s has ended: %w", r.addr, err)
	}
	return nil
}

func (r *remoteSession) upload(ctx context.Context, path, name string) error {
	if err := r.check(); err != nil {
		return err
	}
	return r.s.UploadFile(ctx, name, path)
}

func (r *remoteSession) loadModule(ctx context.Context, name string) (object, error) {
	if err := r.check(); err != nil {
		return nil, err
	}
	m, err := r.s.LoadModule(ctx, name)
	if err != nil {
		return nil, err
	}
	return &remoteModule{r: r, m: m}, nil
}

func (r *remoteSession) info() map[string]any {
	in := r.s.Info()
	out := map[string]any{"kind": "remote", "addr": r.addr, "id": in.ID, "expires": r.s.Expires().Format(time.RFC3339)}
	if r.lease != nil {
		out["key"], out["node"] = r.key, r.lease.NodeID
	}
	return out
}

// localSession runs modules on this machine's CPU. Uploaded files go to a
// directory of its own.
type localSession struct {
	dir string

	mu      sync.Mutex
	closed  bool
	modules []*localModule
}

func (l *localSession) kind() string { return "session" }

func (l *localSession) free() {
	l.mu.Lock()
	l.closed = true
	mods := l.modules
	l.modules = nil
	l.mu.Unlock()
	for _, m := range mods {
		m.close()
	}
	os.RemoveAll(l.dir)
}

func (l *localSession) check() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return errors.New("local session was closed")
	}
	return nil
}

func (l *localSession) upload(_ context.Context, path, name string) error {
	if err := l.check(); err != nil {
		return err
	}
	if name == "" || name != filepath.Base(name) || name == "." || name == ".." {
		return badArg("upload: name %q must be a plain file name", name)
	}
	src, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("upload: %w", err)
	}
	defer src.Close()
	dst, err := os.Create(filepath.Join(l.dir, name))
	if err != nil {
		return fmt.Errorf("upload: %w", err)
	}
	if _, err := io.Copy(dst, src); err != nil {
		dst.Close()
		return fmt.Errorf("upload %s: %w", name, err)
	}
	return dst.Close()
}

// loadModule loads an uploaded file, or a path on this machine.
func (l *localSession) loadModule(_ context.Context, name string) (object, error) {
	if err := l.check(); err != nil {
		return nil, err
	}
	path := name
	if name == filepath.Base(name) {
		if _, err := os.Stat(filepath.Join(l.dir, name)); err == nil {
			path = filepath.Join(l.dir, name)
		}
	}
	a, err := loadExport(path)
	if err != nil {
		return nil, fmt.Errorf("load module %q: %w", name, err)
	}
	dir, err := os.MkdirTemp(l.dir, "module-")
	if err != nil {
		return nil, err
	}
	mod, err := load.Artifact(a, load.Options{Dir: dir})
	if err != nil {
		return nil, fmt.Errorf("load module %q: %w", name, err)
	}
	lm := &localModule{l: l, m: mod, name: name}
	l.mu.Lock()
	l.modules = append(l.modules, lm)
	l.mu.Unlock()
	return lm, nil
}

func (l *localSession) info() map[string]any {
	return map[string]any{"kind": "local", "device": devices.CPUDevice.String()}
}

//export kiln_connect
func kiln_connect(addr, token *C.char, cancel C.KilnHandle, out *C.KilnHandle) C.int {
	return kiln_connect_timeout(addr, token, 0, cancel, out)
}

//export kiln_connect_timeout
func kiln_connect_timeout(addr, token *C.char, timeout C.double, cancel C.KilnHandle, out *C.KilnHandle) C.int {
	ctx, err := contextOf(cancel)
	if err != nil {
		return fail(err, errArgument)
	}
	if out == nil {
		return fail(badArg("no place for the session (NULL)"), errArgument)
	}
	a := gostr(addr)
	if err := checkAddr(a); err != nil {
		return fail(err, errArgument)
	}
	if timeout < 0 {
		return fail(badArg("connect: negative session timeout"), errArgument)
	}
	s, err := client.Connect(ctx, a, client.SessionOptions{Token: gostr(token), Timeout: seconds(timeout)})
	if err != nil {
		return fail(err, errSession)
	}
	*out = newHandle(&remoteSession{s: s, addr: a})
	return 0
}

//export kiln_local
func kiln_local(out *C.KilnHandle) C.int {
	if out == nil {
		return fail(badArg("no place for the session (NULL)"), errArgument)
	}
	dir, err := os.MkdirTemp("", "kiln-local-")
	if err != nil {
		return fail(err, errSession)
	}
	globals.Register()
	*out = newHandle(&localSession{dir: dir})
	return 0
}

//export kiln_session_info
func kiln_session_info(h C.KilnHandle, out **C.char) C.int {
	s, err := lookup[session](h, "session")
	if err != nil {
		return fail(err, errArgument)
	}
	b, err := json.Marshal(s.info())
	if err != nil {
		return fail(err, errInternal)
	}
	return outString(out, string(b))
}

//export kiln_session_upload
func kiln_session_upload(h C.KilnHandle, path, name *C.char, cancel C.KilnHandle) C.int {
	s, err := lookup[session](h, "session")
	if err != nil {
		return fail(err, errArgument)
	}
	ctx, err := contextOf(cancel)
	if err != nil {
		return fail(err, errArgument)
	}
	p, n := gostr(path), gostr(name)
	if n == "" {
		n = filepath.Base(p)
	}
	if _, err := os.Stat(p); err != nil {
		return fail(badArg("upload: %v", err), errArgument)
	}
	if err := s.upload(ctx, p, n); err != nil {
		return fail(err, errSession)
	}
	return 0
}

//export kiln_session_load_module
func kiln_session_load_module(h C.KilnHandle, name *C.char, out *C.KilnHandle) C.int {
	s, err := lookup[session](h, "session")
	if err != nil {
		return fail(err, errArgument)
	}
	if out == nil {
		return fail(badArg("no place for the module (NULL)"), errArgument)
	}
	m, err := s.loadModule(context.Background(), gostr(name))
	if err != nil {
		return fail(err, errSession)
	}
	*out = newHandle(m)
	return 0
}

//export kiln_session_get_function
func kiln_session_get_function(h C.KilnHandle, name *C.char, out *C.KilnHandle) C.int {
	s, err := lookup[session](h, "session")
	if err != nil {
		return fail(err, errArgument)
	}
	if out == nil {
		return fail(badArg("no place for the function (NULL)"), errArgument)
	}
	n := gostr(name)
	switch s := s.(type) {
	case *remoteSession:
		if err := s.check(); err != nil {
			return fail(err, errSession)
		}
		f, err := s.s.GetGlobal(context.Background(), n)
		if err != nil {
			return fail(err, errSession)
		}
		*out = newHandle(&remoteFunc{r: s, f: f})
	case *localSession:
		if err := s.check(); err != nil {
			return fail(err, errSession)
		}
		f, err := packedfunc.Get(n)
		if err != nil {
			return fail(&argError{msg: err.Error(), cause: err}, errArgument)
		}
		*out = newHandle(&localFunc{l: s, f: f})
	}
	return 0
}

// remoteModule is a module loaded in a remote session. The device binds
// a graph artifact's bundled weights itself: its functions take their
// inputs alone.
type remoteModule struct {
	r *remoteSession
	m *client.Module
}

func (m *remoteModule) kind() string { return "module" }
func (m *remoteModule) free() {
	if m.r.check() == nil {
		ctx, cancel := context.WithTimeout(context.Background(), freeTimeout)
		m.m.Free(ctx)
		cancel()
	}
}

// localModule is a module loaded in a local session.
type localModule struct {
	l    *localSession
	m    packedfunc.Module
	name string
	once sync.Once
}

func (m *localModule) kind() string { return "module" }

// free leaves the module loaded until its session closes: arrays and
// functions taken from it may still be in use.
func (m *localModule) free()  {}
func (m *localModule) close() { m.once.Do(func() { m.m.Close() }) }

//export kiln_module_functions
func kiln_module_functions(h C.KilnHandle, out **C.char) C.int {
	handles.RLock()
	o := handles.m[uint64(h)]
	handles.RUnlock()
	var names []string
	switch m := o.(type) {
	case *remoteModule:
		names = m.m.Functions
	case *localModule:
		names = m.m.Functions()
	default:
		_, err := lookup[*remoteModule](h, "module")
		return fail(err, errArgument)
	}
	if names == nil {
		names = []string{}
	}
	b, _ := json.Marshal(names)
	return outString(out, string(b))
}

//export kiln_module_get_function
func kiln_module_get_function(h C.KilnHandle, name *C.char, out *C.KilnHandle) C.int {
	if out == nil {
		return fail(badArg("no place for the function (NULL)"), errArgument)
	}
	handles.RLock()
	o := handles.m[uint64(h)]
	handles.RUnlock()
	n := gostr(name)
	switch m := o.(type) {
	case *remoteModule:
		if err := m.r.check(); err != nil {
			return fail(err, errSession)
		}
		f, err := m.m.GetFunction(context.Background(), n)
		if err != nil {
			return fail(withNames(err, m.m.Functions), errSession)
		}
		*out = newHandle(&remoteFunc{r: m.r, f: f})
	case *localModule:
		if err := m.l.check(); err != nil {
			return fail(err, errSession)
		}
		f, err := m.m.GetFunction(n)
		if err != nil {
			return fail(withNames(fmt.Errorf("get function %q: %w", n, err), m.m.Functions()), errArgument)
		}
		*out = newHandle(&localFunc{l: m.l, f: f})
	default:
		_, err := lookup[*remoteModule](h, "module")
		return fail(err, errArgument)
	}
	return 0
}

// withNames adds the module's function names to a not-found error.
func withNames(err error, names []string) error {
	if errors.Is(err, proto.ErrNotFound) || errors.Is(err, packedfunc.ErrNotFound) {
		return &argError{msg: fmt.Sprintf("%v (the module has %s)", err, strings.Join(names, ", ")), cause: err}
	}
	return err
}

// remoteFunc is a function of a remote module.
type remoteFunc struct {
	r *remoteSession
	f *client.Func
}

func (f *remoteFunc) kind() string { return "function" }
func (f *remoteFunc) free() {
	if f.r.check() == nil {
		ctx, cancel := context.WithTimeout(context.Background(), freeTimeout)
		f.f.Free(ctx)
		cancel()
	}
}

// localFunc is a function of a local module.
type localFunc struct {
	l *localSession
	f *packedfunc.Func
}

func (f *localFunc) kind() string { return "function" }
func (f *localFunc) free()        {}
