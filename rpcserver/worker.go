package rpcserver

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/kiln-ml/kiln/artifact"
	"github.com/kiln-ml/kiln/devices"
	"github.com/kiln-ml/kiln/devices/cpu"
	"github.com/kiln-ml/kiln/devices/cuda"
	"github.com/kiln-ml/kiln/load"
	_ "github.com/kiln-ml/kiln/load/cudaload" // cuda artifacts load
	"github.com/kiln-ml/kiln/ndarray"
	"github.com/kiln-ml/kiln/packedfunc"
	"github.com/kiln-ml/kiln/rpcserver/globals"
	"github.com/kiln-ml/kiln/rpcserver/proto"
	"github.com/kiln-ml/kiln/rpcserver/timer"
	"github.com/kiln-ml/kiln/vm"
)

// The environment of a worker process, set by the daemon.
const (
	// EnvWorkerFD is the file descriptor of the worker's connection to the
	// daemon (an AF_UNIX socket; 3, the first of exec.Cmd.ExtraFiles).
	EnvWorkerFD = "KILN_RPC_WORKER_FD"
	// EnvWorkerCallFD is the file descriptor of the worker's second
	// connection to the daemon, which carries calls as plain frames
	// (proto.Server.ServeFrames; 4, the second of exec.Cmd.ExtraFiles).
	EnvWorkerCallFD = "KILN_RPC_WORKER_CALL_FD"
	// EnvWorkerHandoffFD is the file descriptor of an AF_UNIX packet
	// socket on which the daemon passes clients' call connections
	// (SCM_RIGHTS; 5). The worker answers each and serves its calls.
	EnvWorkerHandoffFD = "KILN_RPC_WORKER_HANDOFF_FD"
	// EnvWorkerBoardFD is the file descriptor of the call board, memory
	// the worker shares with the daemon (6): it says there which requests
	// are running, so that the daemon can name the one that crashed.
	EnvWorkerBoardFD = "KILN_RPC_WORKER_BOARD_FD"
	// EnvWorkerDir is the session's directory: files/ holds the client's
	// files, modules/ the worker's copies of loaded modules.
	EnvWorkerDir = "KILN_RPC_WORKER_DIR"
	// EnvWorkerSession is the session id, for logs.
	EnvWorkerSession = "KILN_RPC_WORKER_SESSION"
	// EnvWorkerQuota is the session's disk quota in bytes (0: none); the
	// worker's private copies of loaded modules count against it.
	EnvWorkerQuota = "KILN_RPC_WORKER_QUOTA"
	// EnvWorkerMaxFrame bounds one request frame on the worker's
	// connections (the daemon's Config.MaxFrameSize; proto's default when
	// unset), the call connection included.
	EnvWorkerMaxFrame = "KILN_RPC_WORKER_MAX_FRAME"
	// EnvWorkerLogLevel is the worker's slog level ("debug", "info", …).
	EnvWorkerLogLevel = "KILN_RPC_WORKER_LOG"
)

// Global functions every worker registers, for tests and benchmarks.
const (
	// GlobalNop does nothing and returns nil: the empty remote function of
	// the rpc-call benchmark.
	GlobalNop = "rpcserver.nop"
	// GlobalEcho returns its first argument (nil without one).
	GlobalEcho = "rpcserver.echo"
)

var registerGlobals sync.Once

// WorkerConfig configures RunWorker.
type WorkerConfig struct {
	// Dir is the session's directory (see EnvWorkerDir); it must hold files/.
	Dir string
	// Session names the session in logs.
	Session string
	// Logger receives the worker's logs (slog.Default() when nil).
	Logger *slog.Logger
	// Quota bounds the bytes of the session's directory (see
	// EnvWorkerQuota); 0 means no limit.
	Quota int64
	// Calls, when set, is a second connection from the daemon that carries
	// calls as plain frames (see EnvWorkerCallFD); the worker serves it
	// beside conn and stops when either ends.
	Calls net.Conn
	// Handoff, when set, brings clients' call connections from the daemon
	// (see EnvWorkerHandoffFD); the worker serves each until it ends.
	Handoff *net.UnixConn

	// MaxFrameSize bounds one request frame (proto's default when 0).
	MaxFrameSize int

	// board is the call board shared with the daemon (WorkerMain maps
	// it); with one, a call past its deadline kills this process.
	board *board
}

// WorkerMain is the body of a worker process: the hidden CLI subcommand the
// daemon starts (Config.WorkerArgs) calls it and exits with its result. It
// reads its connection and directory from the environment the daemon set
// (EnvWorkerFD, EnvWorkerDir), logs to stderr, serves the session until the
// daemon closes the connection or sends SIGTERM, and returns the exit code.
func WorkerMain() int {
	level := slog.LevelInfo
	if v := os.Getenv(EnvWorkerLogLevel); v != "" {
		level.UnmarshalText([]byte(v))
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level})).
		With("worker", os.Getpid(), "session", os.Getenv(EnvWorkerSession))
	if os.Getenv(EnvWorkerFD) == "" {
		log.Error("not started by a kiln device daemon: no worker connection", "env", EnvWorkerFD)
		return 2
	}
	var conn, calls, hand net.Conn
	var brd *board
	for _, e := range []struct {
		env, what string
		open      func(*os.File) error
	}{
		{EnvWorkerFD, "worker connection", func(f *os.File) (err error) { conn, err = net.FileConn(f); return err }},
		{EnvWorkerCallFD, "call connection", func(f *os.File) (err error) { calls, err = net.FileConn(f); return err }},
		{EnvWorkerHandoffFD, "handoff connection", func(f *os.File) (err error) { hand, err = net.FileConn(f); return err }},
		{EnvWorkerBoardFD, "call board", func(f *os.File) (err error) { brd, err = mapBoard(f); return err }},
	} {
		v := os.Getenv(e.env)
		if v == "" {
			continue
		}
		fd, err := strconv.Atoi(v)
		if err != nil || fd < 3 {
			log.Error("bad "+e.what+" descriptor", "env", e.env, "value", v)
			return 2
		}
		f := os.NewFile(uintptr(fd), e.what)
		err = e.open(f)
		f.Close()
		if err != nil {
			log.Error("open "+e.what, "err", err)
			return 2
		}
	}
	handoff, ok := hand.(*net.UnixConn)
	if hand != nil && !ok {
		log.Error("the handoff connection is not a Unix socket", "type", fmt.Sprintf("%T", hand))
		return 2
	}
	if names, err := loadPlugins(os.Getenv(EnvWorkerPluginFDs)); err != nil {
		log.Error("load the board's plugins", "err", err)
		return 2
	} else if len(names) > 0 {
		log.Debug("plugins loaded", "functions", names)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	var quota int64
	var err error
	if v := os.Getenv(EnvWorkerQuota); v != "" {
		if quota, err = strconv.ParseInt(v, 10, 64); err != nil || quota < 0 {
			log.Error("bad session quota", "env", EnvWorkerQuota, "value", v)
			return 2
		}
	}
	var maxFrame int
	if v := os.Getenv(EnvWorkerMaxFrame); v != "" {
		if maxFrame, err = strconv.Atoi(v); err != nil || maxFrame < 0 {
			log.Error("bad frame limit", "env", EnvWorkerMaxFrame, "value", v)
			return 2
		}
	}
	err = RunWorker(ctx, conn, WorkerConfig{Dir: os.Getenv(EnvWorkerDir), Session: os.Getenv(EnvWorkerSession), Logger: log, Calls: calls, Quota: quota, Handoff: handoff, MaxFrameSize: maxFrame, board: brd})
	if err != nil {
		log.Error("worker stopped", "err", err)
		return 1
	}
	log.Debug("worker exiting")
	return 0
}

// RunWorker serves one session on conn (the dialing end is the daemon,
// with proto.RoleWorker) until the connection ends or ctx is cancelled,
// then releases every module and array of the session.
func RunWorker(ctx context.Context, conn net.Conn, cfg WorkerConfig) error {
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	globals.Register()
	registerGlobals.Do(func() {
		packedfunc.MustRegister(GlobalNop, func() {})
		packedfunc.Register(GlobalEcho, packedfunc.New(GlobalEcho, func(args []packedfunc.Value) (packedfunc.Value, error) {
			if len(args) == 0 {
				return packedfunc.Nil, nil
			}
			return args[0], nil
		}), true)
	})
	files := filepath.Join(cfg.Dir, "files")
	box, err := openSandbox(files, 0)
	if err != nil {
		conn.Close()
		if cfg.Calls != nil {
			cfg.Calls.Close()
		}
		return fmt.Errorf("worker: %w", err)
	}
	defer box.Close()
	root, err := os.OpenRoot(cfg.Dir)
	if err != nil {
		conn.Close()
		if cfg.Calls != nil {
			cfg.Calls.Close()
		}
		return fmt.Errorf("worker: open session directory: %w", err)
	}
	defer root.Close()
	w := &worker{box: box, root: root, dir: cfg.Dir, quota: cfg.Quota, h: newHandles(), log: log, board: cfg.board}
	defer w.h.closeAll()

	srv := proto.NewServer(proto.ServerConfig{Roles: []proto.Role{proto.RoleWorker}, KeepAlive: -1, Logger: log, MaxFrameSize: cfg.MaxFrameSize})
	w.register(srv)
	log.Debug("worker serving", "dir", cfg.Dir)
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var cerr error
	var wg sync.WaitGroup
	if cfg.Calls != nil {
		wg.Go(func() {
			cerr = srv.ServeFrames(sctx, cfg.Calls)
			cancel()
		})
	}
	if cfg.Handoff != nil {
		stopHand := context.AfterFunc(sctx, func() { cfg.Handoff.Close() })
		defer stopHand()
		wg.Go(func() { w.adoptCalls(sctx, srv, cfg.Handoff, &wg) })
	}
	err = srv.ServeConn(sctx, conn)
	cancel()
	wg.Wait()
	if err == nil {
		err = cerr
	}
	log.Debug("worker connection ended", "err", err)
	if err != nil && ctx.Err() == nil {
		return fmt.Errorf("worker: %w", err)
	}
	return nil
}

// adoptCalls receives clients' call connections from the daemon until the
// handoff socket closes: it answers each (a Response frame, ID 1, saying
// the worker has it) and serves its calls until it ends.
func (w *worker) adoptCalls(ctx context.Context, srv *proto.Server, hand *net.UnixConn, wg *sync.WaitGroup) {
	buf := make([]byte, 16)
	oob := make([]byte, syscall.CmsgSpace(4*4))
	for {
		_, oobn, _, _, err := hand.ReadMsgUnix(buf, oob)
		if err != nil {
			if ctx.Err() == nil && !errors.Is(err, net.ErrClosed) && !errors.Is(err, io.EOF) {
				w.log.Warn("handoff connection", "err", err)
			}
			return
		}
		msgs, err := syscall.ParseSocketControlMessage(oob[:oobn])
		if err != nil {
			w.log.Warn("handoff: bad control message", "err", err)
			continue
		}
		for _, m := range msgs {
			fds, err := syscall.ParseUnixRights(&m)
			if err != nil {
				continue
			}
			for _, fd := range fds {
				syscall.CloseOnExec(fd)
				f := os.NewFile(uintptr(fd), "call")
				nc, err := net.FileConn(f)
				f.Close()
				if err != nil {
					w.log.Warn("handoff: adopt call connection", "err", err)
					continue
				}
				nc.SetWriteDeadline(time.Now().Add(proto.DefaultHandshakeTimeout))
				if err := proto.WriteFrame(nc, proto.Response{ID: 1}, 0); err != nil {
					w.log.Warn("handoff: answer call connection", "err", err)
					nc.Close()
					continue
				}
				nc.SetWriteDeadline(time.Time{})
				w.log.Debug("serving a call connection", "remote", nc.RemoteAddr())
				wg.Go(func() { srv.ServeAdopted(ctx, nc, proto.RoleCall) })
			}
		}
	}
}

// worker holds one session's objects.
type worker struct {
	board *board // nil when there is none
	box   *sandbox
	// root is the session's directory: module copies are written
	// through it, so no symbolic link leads them out.
	root  *os.Root
	dir   string // the session's directory
	quota int64  // bytes of dir; 0 means no limit
	h     *handles
	log   *slog.Logger

	// loadMu serializes module loads, so that a quota check holds until
	// its copy is written.
	loadMu  sync.Mutex
	mu      sync.Mutex
	modules int // modules loaded, to name their directories (under loadMu)
	// vms are the graph-level modules loaded; their cached weight
	// transforms are dropped whenever an array's contents change.
	vms []*vm.VM
}

// arrayChanged drops the VMs' cached results: new values copied into an
// array that was passed as a weight must not meet a stale transform.
func (w *worker) arrayChanged() {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, m := range w.vms {
		m.ClearCache()
	}
}

// handler adapts a typed method to proto.HandlerFunc.
func handler[A any](fn func(ctx context.Context, a A) (any, error)) proto.HandlerFunc {
	return func(ctx context.Context, _ *proto.Conn, raw msgpack.RawMessage) (any, error) {
		var a A
		if err := msgpack.Unmarshal(raw, &a); err != nil {
			return nil, fmt.Errorf("decode arguments: %v: %w", err, proto.ErrBadRequest)
		}
		return fn(ctx, a)
	}
}

// handle registers a method whose requests go on the call board, and
// kills this worker when a call or timing runs past its deadline (with a
// board: the daemon then names it): a kernel cannot be interrupted, and the
// device must not stay busy until the session's deadline.
func (w *worker) handle(srv *proto.Server, method string, fn proto.HandlerFunc) {
	mi := boardMethod(method)
	watch := method == proto.FuncCall || method == proto.FuncTime
	srv.Handle(method, func(ctx context.Context, c *proto.Conn, raw msgpack.RawMessage) (out any, err error) {
		// The client sees its files by their names in the session, not
		// by the daemon's paths.
		defer func() { err = relativeErr(err, w.dir, "") }()
		if w.board == nil {
			return fn(ctx, c, raw)
		}
		slot := w.board.claim(mi, c.Role() == proto.RoleCall)
		defer func() { w.board.release(slot, err) }()
		ctx = context.WithValue(ctx, slotKey{}, slot)
		if _, ok := ctx.Deadline(); ok && watch {
			stop := context.AfterFunc(ctx, func() {
				if errors.Is(ctx.Err(), context.DeadlineExceeded) && w.board.overran(slot) {
					w.log.Error("call past its deadline: this worker ends itself", "method", method)
					syscall.Kill(os.Getpid(), syscall.SIGKILL)
				}
			})
			defer stop()
		}
		return fn(ctx, c, raw)
	})
}

func (w *worker) register(srv *proto.Server) {
	w.handle(srv, proto.ModuleLoad, handler(w.loadModule))
	w.handle(srv, proto.ModuleGetFunction, handler(w.getFunction))
	w.handle(srv, proto.GlobalGet, handler(w.getFunction))
	w.handle(srv, proto.GlobalList, func(context.Context, *proto.Conn, msgpack.RawMessage) (any, error) {
		return packedfunc.List(), nil
	})
	w.handle(srv, proto.FuncCall, handler(w.call))
	w.handle(srv, proto.FuncTime, handler(w.timeEvaluator))
	w.handle(srv, proto.ArrayEmpty, handler(w.empty))
	w.handle(srv, proto.HandleFree, handler(func(_ context.Context, a proto.HandleArgs) (any, error) {
		return nil, w.h.free(a.Handle)
	}))
	w.handle(srv, proto.DeviceAttrs, func(context.Context, *proto.Conn, msgpack.RawMessage) (any, error) {
		return CollectDeviceAttrs(), nil
	})
	w.handle(srv, proto.WorkerBulkSize, handler(w.bulkSize))
	for m, fn := range map[string]proto.BulkHandlerFunc{proto.ArrayCopyFrom: w.copyFrom, proto.ArrayCopyTo: w.copyTo} {
		srv.HandleBulk(m, func(ctx context.Context, c *proto.Conn, in proto.Bulk) (proto.Bulk, error) {
			out, err := fn(ctx, c, in)
			return out, relativeErr(err, w.dir, "")
		})
	}
}

// loadModule loads a .kiln artifact's host.so, or a bare shared object,
// from the session's files. The worker loads a private copy, so the client
// may replace or remove the file afterwards.
func (w *worker) loadModule(ctx context.Context, a proto.ModuleLoadArgs) (any, error) {
	w.board.label(slotOf(ctx), proto.ModuleLoad, " of \"", a.Name, "\"")
	mod, err := w.openModule(a)
	if err != nil {
		return nil, err
	}
	h := w.h.add(&object{kind: proto.KindModule, name: a.Name, mod: mod})
	w.log.Debug("module loaded", "name", a.Name, "handle", h, "functions", mod.Functions())
	return proto.ModuleInfo{Handle: h, Type: mod.Type(), Functions: mod.Functions()}, nil
}

// globalLoadCPU is the TVM runtime's global that loads a shared object
// from a path.
const globalLoadCPU = "runtime.module.load_cpu"

// loadCPU is runtime.module.load_cpu as a session sees it: its path names
// one of the session's files (resolved through the session's os.Root, so
// nothing else on the machine), loaded as session.module.load does.
func (w *worker) loadCPU() *packedfunc.Func {
	return packedfunc.New(globalLoadCPU, func(args []packedfunc.Value) (packedfunc.Value, error) {
		if len(args) != 1 {
			return packedfunc.Nil, fmt.Errorf("%s: takes 1 argument (a file of the session), got %d: %w", globalLoadCPU, len(args), proto.ErrBadRequest)
		}
		name, err := args[0].AsString()
		if err != nil {
			return packedfunc.Nil, fmt.Errorf("%s: %v: %w", globalLoadCPU, err, proto.ErrBadRequest)
		}
		mod, err := w.openModule(proto.ModuleLoadArgs{Name: name})
		if err != nil {
			return packedfunc.Nil, err
		}
		return packedfunc.ModuleValue(mod), nil
	})
}

// openModule loads the module a names from the session's files.
func (w *worker) openModule(a proto.ModuleLoadArgs) (packedfunc.Module, error) {
	f, size, err := w.box.Open(a.Name)
	if err != nil {
		return nil, fmt.Errorf("load module: %w", err)
	}
	defer f.Close()
	var magic [4]byte
	if _, err := f.ReadAt(magic[:], 0); err != nil {
		return nil, fmt.Errorf("load module %q: too short to be a module: %w", a.Name, proto.ErrBadRequest)
	}
	var head [512]byte
	n, _ := f.ReadAt(head[:], 0)
	var lib []byte
	var art *artifact.Artifact
	switch {
	case artifact.IsTar(head[:n]):
		// A tar export (export_library's .tar): the artifact inside.
		if art, err = artifact.ReadTar(io.NewSectionReader(f, 0, size)); err != nil {
			return nil, fmt.Errorf("load module %q: %v: %w", a.Name, err, proto.ErrBadRequest)
		}
		lib = art.Files[artifact.HostLib]
		if lib == nil {
			return nil, fmt.Errorf("load module %q: the artifact has no %s: %w", a.Name, artifact.HostLib, proto.ErrBadRequest)
		}
	case bytes.Equal(magic[:], []byte("PK\x03\x04")):
		// Within the session's disk quota: what it inflates to must fit
		// there anyway, and an artifact that declares more is refused
		// before anything is inflated into the worker.
		art, err = artifact.ReadWithin(f, size, w.quota)
		if errors.Is(err, artifact.ErrTooLarge) && w.quota > 0 {
			return nil, fmt.Errorf("load module %q: %v (the session's disk quota, the daemon's --max-session-bytes): %w", a.Name, err, proto.ErrQuota)
		}
		if err != nil {
			return nil, fmt.Errorf("load module %q: %v: %w", a.Name, err, proto.ErrBadRequest)
		}
		lib = art.Files[artifact.HostLib]
		if lib == nil {
			return nil, fmt.Errorf("load module %q: the artifact has no %s: %w", a.Name, artifact.HostLib, proto.ErrBadRequest)
		}
	case bytes.Equal(magic[:], []byte("\x7fELF")):
		if lib, err = io.ReadAll(io.NewSectionReader(f, 0, size)); err != nil {
			return nil, fmt.Errorf("load module %q: %w", a.Name, err)
		}
	default:
		return nil, fmt.Errorf("load module %q: neither a .kiln artifact nor a shared object: %w", a.Name, proto.ErrBadRequest)
	}
	w.loadMu.Lock()
	defer w.loadMu.Unlock()
	if w.quota > 0 {
		if used := dirBytes(w.dir); used+int64(len(lib)) > w.quota {
			return nil, fmt.Errorf("load module %q: its private copy of %d bytes would take the session past its disk quota of %d bytes (the daemon's --max-session-bytes; %d in use): %w", a.Name, len(lib), w.quota, used, proto.ErrQuota)
		}
	}
	w.modules++ // only loads change it, under loadMu
	rel := filepath.Join("modules", strconv.Itoa(w.modules))
	if art == nil {
		// A bare shared object: a module of kernels.
		art = &artifact.Artifact{Files: map[string][]byte{artifact.HostLib: lib}}
	}
	var dev devices.Device
	if load.IsCUDA(art) {
		if ok, why := cuda.Available(); !ok {
			return nil, fmt.Errorf("load module %q: the artifact is built for %s, and this device daemon has no usable cuda device: %s: %w", a.Name, art.Manifest.Target, why, proto.ErrBadRequest)
		}
		dev = cudaDevice
	}
	if err := w.root.MkdirAll(rel, 0o700); err != nil {
		return nil, fmt.Errorf("load module %q: %w", a.Name, rootErr("make module directory", rel, err))
	}
	mod, err := load.Artifact(art, load.Options{Root: w.root, Dir: rel, Device: dev, MemoryCfg: a.MemoryCfg})
	if err != nil {
		// Nothing of a failed load stays behind. A library that did load
		// stays mapped (RTLD_NODELETE), but its file is no longer needed.
		w.root.RemoveAll(rel)
		if errors.Is(err, syscall.ENOSPC) && w.quota > 0 {
			return nil, fmt.Errorf("load module %q: %v: the session's writable space is full (a tmpfs of the daemon's --max-session-bytes, %d bytes, or a quarter of the board's memory when that is less): %w", a.Name, err, w.quota, proto.ErrQuota)
		}
		return nil, fmt.Errorf("load module %q: %v: %w", a.Name, err, proto.ErrBadRequest)
	}
	if k, ok := mod.Kernels().(*cuda.HostModule); ok {
		w.log.Debug("cuda module loaded", "device", dev, "image", k.Image(), "kernels", len(k.DeviceMetadata().Kernels))
	}
	if m := mod.VM(); m != nil {
		w.mu.Lock()
		w.vms = append(w.vms, m)
		w.mu.Unlock()
	}
	return mod, nil
}

// cudaDevice is the GPU a worker runs cuda artifacts on: the first one it
// sees (CUDA_VISIBLE_DEVICES, which workers inherit, picks it).
var cudaDevice = devices.Device{Type: devices.CUDA, ID: 0}

// getFunction looks a function up in a module or in the global registry.
func (w *worker) getFunction(_ context.Context, a proto.GetFunctionArgs) (any, error) {
	var fn *packedfunc.Func
	var err error
	switch {
	case a.Module == 0 && a.Name == globalLoadCPU:
		fn = w.loadCPU()
	case a.Module == 0:
		fn, err = packedfunc.Get(a.Name)
	default:
		var o *object
		if o, err = w.h.acquire(a.Module, proto.KindModule); err != nil {
			return nil, fmt.Errorf("get function %q: %w", a.Name, err)
		}
		fn, err = o.mod.GetFunction(a.Name)
		w.h.release(o)
	}
	if err != nil {
		if errors.Is(err, packedfunc.ErrNotFound) {
			err = fmt.Errorf("%v: %w", err, proto.ErrNotFound)
		}
		return nil, fmt.Errorf("get function %q: %w", a.Name, err)
	}
	h := w.h.add(&object{kind: proto.KindFunc, name: a.Name, fn: fn})
	return proto.FuncInfo{Handle: h, Name: a.Name}, nil
}

// callSetup holds a function and its converted arguments; done releases
// the handles they use.
type callSetup struct {
	fn   *object
	args []packedfunc.Value
	held []*object
	dev  devices.Device // the device of the first array argument (CPU when none)
}

func (w *worker) setup(handle uint64, in []proto.Value) (*callSetup, error) {
	fn, err := w.h.acquire(handle, proto.KindFunc)
	if err != nil {
		return nil, err
	}
	cs := &callSetup{fn: fn, held: []*object{fn}, dev: devices.CPUDevice}
	cs.args = make([]packedfunc.Value, len(in))
	haveDev := false
	for i, v := range in {
		pv, o, err := w.toPacked(v)
		if err != nil {
			w.done(cs)
			return nil, fmt.Errorf("argument %d: %w", i, err)
		}
		if o != nil {
			cs.held = append(cs.held, o)
			if o.arr != nil && !haveDev {
				cs.dev, haveDev = o.arr.Device(), true
			}
		}
		cs.args[i] = pv
	}
	return cs, nil
}

func (w *worker) done(cs *callSetup) {
	for _, o := range cs.held {
		w.h.release(o)
	}
}

// call calls a function.
func (w *worker) call(ctx context.Context, a proto.CallArgs) (any, error) {
	cs, err := w.setup(a.Func, a.Args)
	if err != nil {
		return nil, err
	}
	w.board.label(slotOf(ctx), "function \"", cs.fn.name, "\" (", proto.FuncCall, ")")
	defer w.done(cs)
	out, err := cs.fn.fn.Call(cs.args...)
	if err != nil {
		return nil, w.spaceFull(callError(err))
	}
	return w.fromPacked(out, cs), nil
}

// spaceFull adds to a function's failure that the session's writable
// space is full, when it is: a kernel's write there failed with ENOSPC,
// which the kernel may report in its own words, and the client should
// learn which cap it hit.
func (w *worker) spaceFull(err error) error {
	if w.quota <= 0 {
		return err
	}
	size, free, ok := tmpfsSpace(w.dir)
	if !ok || free >= 64<<10 {
		return err
	}
	return fmt.Errorf("%w (the session's writable space is full: its directory is a tmpfs of %d bytes, the daemon's --max-session-bytes or a quarter of the board's memory when that is less)", err, size)
}

// callError classes a function's failure for the wire: argument errors are
// bad requests, the rest keep their text under ErrInternal. The caller
// names the function (proto.FuncCall), so an error that names it itself
// (a refused argument, a kernel's failure) is said without its name.
func callError(err error) error {
	var ae *packedfunc.ArgumentError
	var ke *cpu.KernelError
	switch {
	case errors.As(err, &ae):
		return fmt.Errorf("argument %d: %v: %w", ae.Index, ae.Err, proto.ErrBadRequest)
	case errors.Is(err, packedfunc.ErrType), errors.Is(err, packedfunc.ErrArity):
		return fmt.Errorf("%v: %w", err, proto.ErrBadRequest)
	case errors.Is(err, packedfunc.ErrNotFound):
		return fmt.Errorf("%v: %w", err, proto.ErrNotFound)
	case errors.As(err, &ke):
		return fmt.Errorf("kernel returned %d: %s: %w", ke.Code, ke.Msg, proto.ErrInternal)
	case errors.Is(err, cpu.ErrClosed):
		return fmt.Errorf("%v: %w", err, proto.ErrNotFound)
	}
	return err
}

// timeEvaluator runs the time evaluator next to the function.
func (w *worker) timeEvaluator(ctx context.Context, a proto.TimeArgs) (any, error) {
	cs, err := w.setup(a.Func, a.Args)
	if err != nil {
		return nil, err
	}
	defer w.done(cs)
	w.board.label(slotOf(ctx), "function \"", cs.fn.name, "\" (", proto.FuncTime, ")")
	e := &timer.Evaluator{Call: func() error {
		_, err := cs.fn.fn.Call(cs.args...)
		return err
	}, Probe: &timer.Probe{Emulated: os.Getenv(EnvEmulated), OtherSessions: w.board.peers}}
	o := a.Options
	if o.Preproc != "" {
		pre, err := packedfunc.Get(o.Preproc)
		if err != nil {
			return nil, fmt.Errorf("time %q: f_preproc: %v: %w", cs.fn.name, err, proto.ErrNotFound)
		}
		e.Preproc = func() error {
			_, err := pre.Call(cs.args...)
			return err
		}
	}
	if cs.dev.Type != devices.CPU {
		api, err := devices.For(cs.dev)
		if err != nil {
			return nil, fmt.Errorf("time evaluator: %v: %w", err, proto.ErrBadRequest)
		}
		dev := cs.dev
		e.Sync = func() error { return api.StreamSync(dev, 0) }
	}
	if cs.dev.Type == devices.CUDA {
		// Kernels are timed on the GPU, between events on the default
		// stream they are launched on.
		if o.CacheFlushBytes > 0 {
			return nil, fmt.Errorf("the cache flush (cache_flush_bytes) flushes the CPU's caches and is not supported on %s: %w", cs.dev, proto.ErrBadRequest)
		}
		tm, err := cuda.NewEventTimer(cs.dev)
		if err != nil {
			return nil, err
		}
		defer tm.Close()
		e.Timer = tm
	}
	r, err := e.Evaluate(ctx, timer.OptionsOf(o))
	if err != nil {
		if errors.Is(err, timer.ErrOptions) {
			err = fmt.Errorf("%v: %w", err, proto.ErrBadRequest)
		}
		return nil, callError(err)
	}
	return r.Wire(cs.dev.String()), nil
}

// empty allocates an array.
func (w *worker) empty(_ context.Context, a proto.EmptyArgs) (any, error) {
	dt, err := ndarray.ParseDType(a.DType)
	if err != nil {
		return nil, fmt.Errorf("empty: %v: %w", err, proto.ErrBadRequest)
	}
	dev := devices.CPUDevice
	if a.Device != "" {
		if dev, err = devices.ParseDevice(a.Device); err != nil {
			return nil, fmt.Errorf("empty: %v: %w", err, proto.ErrBadRequest)
		}
	}
	for i, d := range a.Shape {
		if d < 0 {
			return nil, fmt.Errorf("empty: dimension %d is %d: %w", i, d, proto.ErrBadRequest)
		}
	}
	arr, err := ndarray.Empty(ndarray.Shape(a.Shape), dt, dev)
	if err != nil {
		if errors.Is(err, devices.ErrNoBackend) || errors.Is(err, devices.ErrNoDevice) {
			return nil, fmt.Errorf("empty: %v: %w", err, proto.ErrNotFound)
		}
		return nil, fmt.Errorf("empty: %v: %w", err, proto.ErrBadRequest)
	}
	o := &object{kind: proto.KindArray, arr: arr, owned: true}
	h := w.h.add(o)
	return arrayInfo(h, arr), nil
}

func arrayInfo(h uint64, arr *ndarray.NDArray) *proto.ArrayInfo {
	return &proto.ArrayInfo{Handle: h, Shape: append([]int64{}, arr.Shape()...), DType: arr.DType().String(),
		Device: arr.Device().String(), Bytes: arr.NumBytes()}
}

// arrayHandle parses a bulk stream's name as an array handle.
func arrayHandle(name string) (uint64, error) {
	h, err := strconv.ParseUint(name, 10, 64)
	if err != nil || h == 0 {
		return 0, fmt.Errorf("array handle %q is not a positive decimal number: %w", name, proto.ErrBadRequest)
	}
	return h, nil
}

// copyFrom fills an array from a bulk upload.
func (w *worker) copyFrom(_ context.Context, _ *proto.Conn, in proto.Bulk) (proto.Bulk, error) {
	h, err := arrayHandle(in.Name)
	if err != nil {
		return proto.Bulk{}, fmt.Errorf("copy to array: %w", err)
	}
	o, err := w.h.acquire(h, proto.KindArray)
	if err != nil {
		return proto.Bulk{}, fmt.Errorf("copy to array: %w", err)
	}
	defer w.h.release(o)
	n := o.arr.NumBytes()
	if in.Size != n {
		return proto.Bulk{}, fmt.Errorf("copy to array %d (%s): %d bytes sent, the array holds %d: %w", h, o.arr, in.Size, n, proto.ErrBadRequest)
	}
	if o.arr.Device().Type == devices.CPU && o.arr.IsContiguous() {
		hb, err := o.arr.HostBytes()
		if err == nil {
			if _, err := io.ReadFull(in.Body, hb); err != nil {
				return proto.Bulk{}, fmt.Errorf("copy to array %d: %w", h, err)
			}
			w.arrayChanged()
			return proto.Bulk{}, nil
		}
	}
	buf := make([]byte, n)
	if _, err := io.ReadFull(in.Body, buf); err != nil {
		return proto.Bulk{}, fmt.Errorf("copy to array %d: %w", h, err)
	}
	if err := o.arr.CopyFromBytes(buf); err != nil {
		return proto.Bulk{}, fmt.Errorf("copy to array %d: %w", h, err)
	}
	w.arrayChanged()
	return proto.Bulk{}, nil
}

// copyTo sends an array's contents back.
func (w *worker) copyTo(_ context.Context, _ *proto.Conn, in proto.Bulk) (proto.Bulk, error) {
	h, err := arrayHandle(in.Name)
	if err != nil {
		return proto.Bulk{}, fmt.Errorf("copy from array: %w", err)
	}
	o, err := w.h.acquire(h, proto.KindArray)
	if err != nil {
		return proto.Bulk{}, fmt.Errorf("copy from array: %w", err)
	}
	if o.arr.Device().Type == devices.CPU && o.arr.IsContiguous() {
		if hb, err := o.arr.HostBytes(); err == nil {
			// The array stays held until proto closes the body once sent.
			return proto.Bulk{Name: in.Name, Size: int64(len(hb)), Body: &heldReader{Reader: bytes.NewReader(hb), release: func() { w.h.release(o) }}}, nil
		}
	}
	defer w.h.release(o)
	b, err := o.arr.Bytes()
	if err != nil {
		return proto.Bulk{}, fmt.Errorf("copy from array %d: %w", h, err)
	}
	return proto.Bulk{Name: in.Name, Size: int64(len(b)), Body: bytes.NewReader(b)}, nil
}

// heldReader releases a handle when closed.
type heldReader struct {
	io.Reader
	once    sync.Once
	release func()
}

func (r *heldReader) Close() error {
	r.once.Do(r.release)
	return nil
}

// bulkSize tells the daemon the size of a bulk download before it starts.
func (w *worker) bulkSize(_ context.Context, a proto.BulkSizeArgs) (any, error) {
	if a.Method != proto.ArrayCopyTo {
		return nil, fmt.Errorf("bulk size: unknown download method %q: %w", a.Method, proto.ErrNotFound)
	}
	h, err := arrayHandle(a.Name)
	if err != nil {
		return nil, fmt.Errorf("bulk size: %w", err)
	}
	o, err := w.h.acquire(h, proto.KindArray)
	if err != nil {
		return nil, fmt.Errorf("bulk size: %w", err)
	}
	defer w.h.release(o)
	return o.arr.NumBytes(), nil
}
