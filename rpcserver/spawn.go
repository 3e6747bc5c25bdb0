package rpcserver

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/kiln-ml/kiln/devices/cpu"
	"github.com/kiln-ml/kiln/rpcserver/proto"
)

// WorkerSpec says how the daemon starts a worker process: the same binary
// as the daemon by default, with arguments that reach WorkerMain.
type WorkerSpec struct {
	// Path is the executable (os.Executable() when empty).
	Path string
	// Args are the arguments after the program name (DefaultWorkerArgs
	// when nil).
	Args []string
	// Env is added to the daemon's environment.
	Env []string
	// Wrapper is a command prefix for the worker (e.g. "qemu-aarch64 -L
	// /usr/aarch64-linux-gnu" on an emulated board, or "taskset -c 2",
	// "numactl --cpunodebind=0", "nice"): the worker runs as Wrapper...
	// Path Args....
	Wrapper []string
	// OwnSession starts each worker in a session of its own (setsid)
	// rather than only a process group of its own: where the kernel
	// shares the CPU among sessions before processes (Linux's
	// autogroup), the worker then competes for it as a daemon started on
	// its own would, not within the share of the daemon's session. For
	// several daemons in one process whose workers are pinned to cores
	// of their own (the tune benchmark's fleet).
	OwnSession bool

	// plugins are the board's plugin libraries (Config.Plugins), open
	// read-only in the daemon; each worker gets them as descriptors 7 on
	// and loads them through /proc/self/fd, so the sandbox need not show
	// their directories.
	plugins []*os.File
}

// EnvEmulated, in a worker's environment (WorkerSpec.Env), names the
// emulator the daemon and its workers run under; the time evaluator's
// results then say so (TimeResult.Emulated).
const EnvEmulated = "KILN_EMULATED"

// DefaultWorkerArgs are the arguments that make the kiln binary run
// WorkerMain: the CLI registers a hidden subcommand of this name.
var DefaultWorkerArgs = []string{"rpcserver-worker"}

// workerEnvKeep are the variables of the daemon's environment a worker
// inherits: what the C runtime, kiln's thread pool, CUDA and Go need to run
// kernels (and OpenMP, for modules built before kiln had its own pool).
// Everything else (KILN_TOKEN_FILE, credentials, the operator's shell
// settings) stays with the daemon: uploaded kernels run in the worker.
var workerEnvKeep = []string{
	"PATH", "HOME", "USER", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR",
	"LD_LIBRARY_PATH", "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "CUDA_CACHE_PATH",
	cpu.EnvThreads, cpu.EnvSpin,
	"OMP_NUM_THREADS", "OMP_PROC_BIND", "OMP_PLACES", "OMP_WAIT_POLICY", "GOMP_CPU_AFFINITY", "GOMP_SPINCOUNT",
	"GORACE", "GOCOVERDIR", "GODEBUG", EnvWorkerLogLevel,
}

// workerEnviron keeps the variables of env named in workerEnvKeep.
func workerEnviron(env []string) []string {
	var out []string
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		if slices.Contains(workerEnvKeep, k) {
			out = append(out, kv)
		}
	}
	return out
}

// workerGOMAXPROCS is a worker's GOMAXPROCS unless WorkerSpec.Env sets it.
const workerGOMAXPROCS = "1"

// workerProc is a running worker process and the daemon's connections to
// it: calls go as plain frames on a socket of their own (no yamux hand-offs
// on the hot path), bulk transfers on a yamux session.
type workerProc struct {
	cmd    *exec.Cmd
	client *proto.Client // yamux: bulk transfers
	calls  *proto.Client // plain frames: calls
	stderr *tail
	// hand passes clients' call connections to the worker (SCM_RIGHTS);
	// board is the call board the worker writes (nil where there is none).
	hand  *net.UnixConn
	hmu   sync.Mutex
	board *board
	// boxed says the process is bubblewrap, which reports the worker's
	// death by a signal as exit status 128+signal.
	boxed bool

	exited chan struct{} // closed once the process has been waited for
	state  *os.ProcessState
}

// pid returns the worker's process id.
func (w *workerProc) pid() int { return w.cmd.Process.Pid }

// kill sends SIGKILL (harmless once the process has ended).
func (w *workerProc) kill() {
	select {
	case <-w.exited:
	default:
		w.cmd.Process.Kill()
	}
}

// stop ends the worker gently: it closes the connection (the worker exits
// when it ends), waits up to grace and then kills it. It waits for exit.
func (w *workerProc) stop(grace time.Duration) {
	w.calls.Close()
	w.client.Close()
	w.hand.Close()
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-w.exited:
	case <-t.C:
		w.kill()
		<-w.exited
	}
}

// reason says how the worker ended; valid once exited is closed.
func (w *workerProc) reason() (string, bool) {
	if w.boxed && w.state != nil {
		if ws, ok := w.state.Sys().(syscall.WaitStatus); ok && !ws.Signaled() {
			return exitReasonCode(w.state.ExitCode(), w.stderr.Marks(), true)
		}
	}
	return exitReason(w.state, w.stderr.Marks())
}

// spawnWorker starts a worker for session id in dir, connected to the
// daemon by a socket pair, and says hello to it. onExit runs (in a goroutine
// owned by wg) once the process has ended and been waited for.
func spawnWorker(ctx context.Context, spec WorkerSpec, iso *isolation, jail jailing, id, dir string, quota int64, log *slog.Logger, wg *sync.WaitGroup, onExit func()) (*workerProc, error) {
	path := spec.Path
	if path == "" {
		exe, err := os.Executable()
		if err != nil {
			return nil, fmt.Errorf("start worker: find own executable: %w", err)
		}
		path = exe
	}
	if iso != nil {
		var err error
		if path, err = iso.runnable(path); err != nil {
			return nil, fmt.Errorf("start worker: %w", err)
		}
	}
	args := spec.Args
	if args == nil {
		args = DefaultWorkerArgs
	}
	nc, theirs, err := socketPair()
	if err != nil {
		return nil, fmt.Errorf("start worker: %w", err)
	}
	cnc, ctheirs, err := socketPair()
	if err != nil {
		theirs.Close()
		nc.Close()
		return nil, fmt.Errorf("start worker: %w", err)
	}
	closeAll := func(fs ...io.Closer) {
		for _, f := range fs {
			f.Close()
		}
	}
	hand, htheirs, err := packetPair()
	if err != nil {
		closeAll(theirs, nc, ctheirs, cnc)
		return nil, fmt.Errorf("start worker: %w", err)
	}
	brd, bfile, err := newBoard()
	if err != nil {
		closeAll(theirs, nc, ctheirs, cnc, hand, htheirs)
		return nil, fmt.Errorf("start worker: %w", err)
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		closeAll(theirs, nc, ctheirs, cnc, hand, htheirs, bfile)
		brd.unmap()
		return nil, fmt.Errorf("start worker: pipe: %w", err)
	}

	// Errors name the worker's command as configured, not the sandbox's
	// and the caps' commands around it.
	shown := strings.Join(append(append(append([]string{}, spec.Wrapper...), path), args...), " ")
	first := path
	if len(spec.Wrapper) > 0 {
		first = spec.Wrapper[0]
	}
	if err := iso.checkRunnable(first); err != nil {
		return nil, fmt.Errorf("start worker %s: %w", shown, err)
	}
	argv := iso.command(dir, jail.cgroups, jail.uid, spec.Wrapper, path, args)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir = dir
	// A worker runs Go on one thread by default: a call crosses three
	// processes, and a worker whose idle Ps spin looking for work takes
	// the CPU from the daemon and the client (on 2 shared cores, the empty
	// call's median fell from ~200 µs to ~90 µs). Kernels' own threads
	// (kiln's pool, see devices/cpu) are not Go threads and are not
	// limited. Spec.Env may set
	// GOMAXPROCS otherwise.
	cmd.Env = append(workerEnviron(os.Environ()), "GOMAXPROCS="+workerGOMAXPROCS)
	cmd.Env = append(cmd.Env, spec.Env...)
	cmd.Env = append(cmd.Env,
		EnvWorkerFD+"=3",
		EnvWorkerCallFD+"=4",
		EnvWorkerHandoffFD+"=5",
		EnvWorkerBoardFD+"=6",
		EnvWorkerDir+"="+dir,
		EnvWorkerSession+"="+id,
		EnvWorkerQuota+"="+strconv.FormatInt(quota, 10),
	)
	if log.Enabled(ctx, slog.LevelDebug) {
		cmd.Env = append(cmd.Env, EnvWorkerLogLevel+"=debug")
	}
	cmd.ExtraFiles = []*os.File{theirs, ctheirs, htheirs, bfile}
	if len(spec.plugins) > 0 {
		fds := make([]string, len(spec.plugins))
		for i, f := range spec.plugins {
			fds[i] = strconv.Itoa(3 + len(cmd.ExtraFiles))
			cmd.ExtraFiles = append(cmd.ExtraFiles, f)
		}
		cmd.Env = append(cmd.Env, EnvWorkerPluginFDs+"="+strings.Join(fds, ","))
	}
	cmd.Stdout, cmd.Stderr = errW, errW
	cmd.SysProcAttr = workerSysProcAttr()
	if iso.capMount != "" && iso.bwrap == "" {
		capMountAttr(cmd.SysProcAttr)
	}
	if spec.OwnSession {
		// The session's leader also leads a new process group (its pid).
		cmd.SysProcAttr.Setpgid, cmd.SysProcAttr.Setsid = false, true
	}
	closeOnExec()
	err = cmd.Start()
	// Only the worker holds its ends now: its exit closes the connections.
	closeAll(theirs, ctheirs, htheirs, bfile, errW)
	if err != nil {
		closeAll(errR, nc, cnc, hand)
		brd.unmap()
		return nil, fmt.Errorf("start worker %s: %w", shown, err)
	}
	w := &workerProc{cmd: cmd, stderr: newTail(200), exited: make(chan struct{}), hand: hand, board: brd, boxed: iso.bwrap != ""}
	wlog := log.With("worker", cmd.Process.Pid)

	// The stderr reader and the waiter: the waiter gives the reader a
	// moment after exit to read the last lines (how it died), then closes.
	readDone := make(chan struct{})
	wg.Go(func() {
		defer close(readDone)
		sc := bufio.NewScanner(errR)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			w.stderr.Write([]byte(line + "\n"))
			wlog.Debug("worker output", "line", strings.TrimRight(line, "\r"))
		}
		io.Copy(io.Discard, errR)
	})
	wg.Go(func() {
		// What the worker's kernels forked ends with it.
		waitThenKillGroup(cmd.Process.Pid)
		cmd.Wait()
		t := time.NewTimer(2 * time.Second)
		select {
		case <-readDone:
		case <-t.C:
			errR.Close() // a grandchild holds the pipe open
			<-readDone
		}
		t.Stop()
		errR.Close()
		w.state = cmd.ProcessState
		// onExit records why the session ended before exited is closed, so
		// calls that saw the connection break report that reason.
		if onExit != nil {
			onExit()
		}
		close(w.exited)
	})

	opts := proto.DialOptions{Role: proto.RoleWorker, KeepAlive: -1, Logger: wlog}
	client, err := proto.NewClient(ctx, nc, opts)
	if err == nil {
		w.client = client
		w.calls, err = proto.NewFrameClient(ctx, cnc, opts)
		if err != nil {
			client.Close()
		}
	} else {
		cnc.Close()
	}
	if err != nil {
		w.kill()
		<-w.exited
		hand.Close()
		brd.unmap()
		reason, _ := w.reason()
		return nil, fmt.Errorf("start worker %s: %w (worker %s; last output: %s)", shown, err, reason, lastLines(w.stderr.Lines(), 5))
	}
	return w, nil
}

// jailing is what isolation gave one session: its uid (-1: the daemon's)
// and the cgroup.procs files of its cgroups.
type jailing struct {
	uid     int
	cgroups []string
}

// socketPair returns a connected AF_UNIX stream pair: the daemon's end as a
// net.Conn and the worker's end as a file to pass on.
func socketPair() (net.Conn, *os.File, error) {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("socketpair: %w", err)
	}
	mine := os.NewFile(uintptr(fds[0]), "worker")
	theirs := os.NewFile(uintptr(fds[1]), "daemon")
	nc, err := net.FileConn(mine)
	mine.Close()
	if err != nil {
		theirs.Close()
		return nil, nil, err
	}
	return nc, theirs, nil
}

// packetPair returns a connected AF_UNIX packet pair for passing
// descriptors: the daemon's end as a *net.UnixConn and the worker's as a
// file to pass on.
func packetPair() (*net.UnixConn, *os.File, error) {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_SEQPACKET|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("socketpair: %w", err)
	}
	mine := os.NewFile(uintptr(fds[0]), "handoff")
	theirs := os.NewFile(uintptr(fds[1]), "daemon-handoff")
	c, err := net.FileConn(mine)
	mine.Close()
	if err != nil {
		theirs.Close()
		return nil, nil, err
	}
	uc, ok := c.(*net.UnixConn)
	if !ok {
		c.Close()
		theirs.Close()
		return nil, nil, fmt.Errorf("socketpair: got a %T", c)
	}
	return uc, theirs, nil
}

// handoff passes the client's call connection nc to the worker, which
// answers the client and serves its calls from then on; the daemon's copy
// of the descriptor is the caller's to close.
func (w *workerProc) handoff(nc net.Conn) error {
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return fmt.Errorf("a %T connection cannot be handed to the worker: %w", nc, proto.ErrBadRequest)
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return fmt.Errorf("hand the call connection to the worker: %w", err)
	}
	w.hmu.Lock()
	defer w.hmu.Unlock()
	var serr error
	err = rc.Control(func(fd uintptr) {
		_, _, serr = w.hand.WriteMsgUnix([]byte{1}, syscall.UnixRights(int(fd)), nil)
	})
	if err == nil {
		err = serr
	}
	if err != nil {
		return fmt.Errorf("hand the call connection to the worker: %v: %w", err, proto.ErrUnavailable)
	}
	return nil
}

// lastLines joins the last n lines for an error message.
func lastLines(lines []string, n int) string {
	if len(lines) == 0 {
		return "none"
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}
