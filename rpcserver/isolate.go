package rpcserver

import (
	"bufio"
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	box "github.com/kiln-ml/kiln/internal/sandbox"
)

// Sandbox modes (Config.Sandbox).
const (
	// SandboxAuto sandboxes sessions with bubblewrap when it works on this
	// machine and says at start (and in /metrics) when it does not.
	SandboxAuto = "auto"
	// SandboxBwrap sandboxes sessions with bubblewrap, or New fails.
	SandboxBwrap = "bwrap"
	// SandboxOff runs workers as the daemon's user, in its PID, IPC and
	// network namespaces (a mount namespace of their own caps their
	// session directory).
	SandboxOff = "off"
)

// DefaultMaxSessionProcs is a sandboxed session's default process cap.
const DefaultMaxSessionProcs = 1024

// isolation is how the daemon confines its workers, decided once by New.
type isolation struct {
	bwrap string // the bwrap executable; "" when sessions are not sandboxed
	why   string // why they are not, when bwrap is ""

	uids    []int // the worker uid pool (root only); empty: the daemon's uid
	umu     sync.Mutex
	uidUsed map[int]bool
	// uidFreed is closed (and replaced) when a uid is given back.
	uidFreed chan struct{}

	memory int64 // bytes per session; 0: no cap
	// quota caps what a sandboxed session writes (the size of its
	// directory's tmpfs, and of its /tmp's): the session quota, or a
	// quarter of the machine's memory when that is less (the tmpfs lives
	// in memory); 0: no cap.
	quota int64
	// capMount is the session mounter (the daemon's own binary) that caps an
	// unsandboxed session's directory at quota (see isolate_linux.go);
	// "" when the session is sandboxed or its kernels' writes are not
	// capped (capWhy says why).
	capMount string
	capWhy   string
	procs    int // processes per session; 0: no cap
	// cgroups are the cgroup directories under which each session gets
	// one of its own (memory and pids; v1 has one per controller); empty
	// when there is no memory cap and the process cap is an rlimit of the
	// session's own uid (prlimit), or no cap at all.
	cgroups []cgroupDir
	prlimit string // the prlimit executable, when the process cap is an rlimit
	setpriv string // the setpriv executable, to drop to a pool uid
	// exes maps a worker program to the path a pool uid runs it by (a
	// copy when the program lies where other uids cannot reach it).
	emu  sync.Mutex
	exes map[string]string
}

// cgroupDir is a directory the daemon made for its sessions' cgroups, and
// the files a session's cgroup there gets its caps through.
type cgroupDir struct {
	path   string
	memory string // the file that caps memory ("" when not this controller)
	procs  string // the file that caps processes
	oom    string // the file whose "oom_kill N" line counts OOM kills
	// swap is the file that keeps swap within the memory cap, where the
	// kernel has one: memory.swap.max (v2, swap beside memory, set to 0)
	// or memory.memsw.limit_in_bytes (v1, memory and swap together, set
	// to the cap). Without it a session could hold more than its cap in
	// swap.
	swap string
}

// capsBy says how memory and process caps are enforced, for logs and docs.
func (iso *isolation) capsBy() string {
	switch {
	case iso.memory == 0 && iso.procs == 0:
		return "none"
	case len(iso.cgroups) > 0:
		return "cgroup"
	default:
		return "rlimit"
	}
}

// newIsolation decides how workers are confined.
// explicitQuota says --max-session-bytes was given (not the default).
func newIsolation(cfg Config, explicitQuota bool, log func(msg string, args ...any)) (*isolation, error) {
	iso := &isolation{uidUsed: map[int]bool{}, memory: cfg.MaxSessionMemory, procs: cfg.MaxSessionProcs, quota: writeCap(cfg.SessionQuota)}
	mode := cfg.Sandbox
	if mode == "" {
		mode = SandboxAuto
	}
	switch mode {
	case SandboxOff:
		iso.why = "sandboxing is off (--sandbox off)"
	case SandboxAuto, SandboxBwrap:
		root := os.Geteuid() == 0
		uids := cfg.WorkerUIDs
		if root && len(uids) == 0 {
			// As root, bubblewrap would map the sandbox's uid 0 to the
			// host's root: the workers take uids of their own.
			uids = box.AutoUIDs(max(cfg.MaxSessions, 1))
		}
		path, err := box.Find()
		if err == nil && root {
			iso.setpriv, err = box.FindSetpriv()
		}
		if err == nil {
			uid := -1
			if root {
				uid = uids[0]
			}
			err = box.Probe(context.Background(), path, iso.setpriv, cfg.Dir, uid)
		}
		if err != nil {
			if mode == SandboxBwrap {
				return nil, fmt.Errorf("rpcserver: --sandbox bwrap: %w", err)
			}
			iso.why = err.Error()
		} else if root {
			// The workers' uids must be able to run the daemon's
			// binary, wherever it was installed.
			iso.bwrap, iso.uids = path, uids
			exe, eerr := os.Executable()
			if eerr == nil {
				_, eerr = iso.runnable(exe)
			}
			if eerr != nil {
				if mode == SandboxBwrap {
					return nil, fmt.Errorf("rpcserver: --sandbox bwrap: %w", eerr)
				}
				iso.bwrap, iso.uids, iso.why = "", nil, eerr.Error()
			}
		} else {
			iso.bwrap = path
		}
	default:
		return nil, fmt.Errorf("rpcserver: --sandbox %q: want auto, bwrap or off", mode)
	}
	if len(cfg.WorkerUIDs) > 0 {
		if os.Geteuid() != 0 {
			return nil, fmt.Errorf("rpcserver: --worker-uids needs the daemon to run as root (it runs as user %d)", os.Geteuid())
		}
		if iso.bwrap == "" {
			return nil, fmt.Errorf("rpcserver: --worker-uids needs sandboxed sessions, and %s", iso.why)
		}
		for _, u := range cfg.WorkerUIDs {
			if u <= 0 {
				return nil, fmt.Errorf("rpcserver: --worker-uids: uid %d is not a worker uid (root and negative ids are refused)", u)
			}
		}
		if len(cfg.WorkerUIDs) < max(cfg.MaxSessions, 1) {
			return nil, fmt.Errorf("rpcserver: --worker-uids gives %d uids for --max-sessions %d: each session needs one", len(cfg.WorkerUIDs), cfg.MaxSessions)
		}
	}
	if iso.bwrap == "" && iso.quota > 0 {
		if err := iso.capWrites(cfg.Dir); err != nil {
			if explicitQuota {
				return nil, fmt.Errorf("rpcserver: --max-session-bytes %d: this daemon cannot cap what kernels write into a session's directory (%v); it would cap only uploads and the worker's copies of modules: run it as root or where user namespaces are allowed, sandbox its sessions (bubblewrap), or leave --max-session-bytes out (uploads are then capped at a quarter of the free space, kernels' writes not at all)", cfg.SessionQuota, err)
			}
			iso.capWhy = err.Error()
		}
	}
	if iso.bwrap != "" && iso.procs == 0 {
		iso.procs = DefaultMaxSessionProcs
	}
	if iso.procs < 0 {
		iso.procs = 0
	}
	if iso.memory < 0 {
		iso.memory = 0
	}
	if iso.memory > 0 || iso.procs > 0 {
		iso.cgroups = makeCgroupDirs(log)
	}
	if len(iso.cgroups) == 0 {
		// Without a cgroup a cap is an rlimit, which counts the wrong
		// things: RLIMIT_AS one process's address space (a session's
		// children each get the whole cap, and the Go worker's own
		// reservations exceed a small one), RLIMIT_NPROC every process of
		// the uid (the daemon's user's others too, unless the session has
		// a uid of its own).
		if iso.memory > 0 {
			return nil, fmt.Errorf("rpcserver: --max-session-memory needs a cgroup for each session, and this daemon can make none (%s); run it as root, or in a cgroup delegated to its user with the memory and pids controllers (systemd: Delegate=yes in its unit, or systemd-run --user --scope -p Delegate=yes kiln rpcserver ...; cgroup v1: a memory and a pids cgroup given to its user, the daemon started in them), or leave --max-session-memory out", cgroupWhy())
		}
		if iso.procs > 0 && len(iso.uids) == 0 {
			if cfg.MaxSessionProcs > 0 {
				return nil, fmt.Errorf("rpcserver: --max-session-procs needs a cgroup for each session, or a worker uid of its own (--worker-uids, as root), and this daemon has neither (%s): RLIMIT_NPROC would count every process of the daemon's user; run it as root or in a delegated cgroup, or leave --max-session-procs out", cgroupWhy())
			}
			iso.procs = 0 // the default cap is not an rlimit shared with the daemon's user
		}
	}
	if len(iso.cgroups) == 0 && iso.procs > 0 {
		// A uid of the session's own: RLIMIT_NPROC counts the session's
		// processes, all of them and only them.
		p, err := exec.LookPath("prlimit")
		if err != nil {
			return nil, errors.New("rpcserver: --max-session-procs needs a cgroup the daemon can create or the prlimit command (util-linux); found neither")
		}
		iso.prlimit = p
	}
	return iso, nil
}

// writeCapped is the size of a session directory's tmpfs: the write cap
// where kernels' writes are capped (sandboxed, or by the session mounter),
// else 0.
func (iso *isolation) writeCapped() int64 {
	if iso.bwrap != "" || iso.capMount != "" {
		return iso.quota
	}
	return 0
}

// capWrites readies the session mounter that caps an unsandboxed session's
// directory, after checking that it works here.
func (iso *isolation) capWrites(parent string) error {
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find the daemon's own executable: %w", err)
	}
	if err := probeCapMount(exe, parent); err != nil {
		return err
	}
	iso.capMount = exe
	return nil
}

// writeCap is the size of a sandboxed session's tmpfs mounts for a
// session quota: the quota, or a quarter of the machine's memory when
// that is less, so that a session's writes cannot take the board's memory
// (0: none).
func writeCap(quota int64) int64 {
	var si syscall.Sysinfo_t
	if quota <= 0 || syscall.Sysinfo(&si) != nil {
		return quota
	}
	if ram := int64(si.Totalram) * int64(si.Unit); ram > 0 {
		return min(quota, ram/4)
	}
	return quota
}

// cgroupWhy says why the daemon has no cgroup for its sessions: what it
// found at each place it looked.
func cgroupWhy() string {
	own, err := ownCgroups()
	if err != nil {
		return fmt.Sprintf("it runs as user %d and cannot read its cgroups: %v", os.Geteuid(), err)
	}
	why := []string{fmt.Sprintf("it runs as user %d", os.Geteuid())}
	if rel, ok := own[""]; ok {
		root := cgroupV2Root()
		base := filepath.Join(root, rel)
		ctl, _ := os.ReadFile(filepath.Join(base, "cgroup.controllers"))
		f := strings.Fields(string(ctl))
		switch {
		case root == "":
			why = append(why, "no cgroup v2 hierarchy is mounted at "+cgroupFS)
		case !slices.Contains(f, "memory") || !slices.Contains(f, "pids"):
			why = append(why, fmt.Sprintf("its cgroup v2 %s offers the controllers [%s], not memory and pids", base, strings.Join(f, " ")))
		case syscall.Access(filepath.Join(base, "cgroup.subtree_control"), 2 /* W_OK */) != nil:
			why = append(why, fmt.Sprintf("its cgroup v2 %s is not delegated to it (it may not write cgroup.subtree_control there)", base))
		default:
			why = append(why, fmt.Sprintf("its cgroup v2 %s could not be readied for session cgroups (other processes share it, or a child cgroup could not be made)", base))
		}
	}
	for _, c := range []string{"memory", "pids"} {
		if rel, ok := own[c]; ok {
			why = append(why, fmt.Sprintf("it may not make cgroups in its cgroup v1 %s cgroup %s", c, filepath.Join(cgroupFS, c, rel)))
		}
	}
	return strings.Join(why, "; ")
}

// ownCgroups maps each controller of this process's cgroups ("" for
// cgroup v2) to its cgroup path.
func ownCgroups() (map[string]string, error) {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return nil, err
	}
	own := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		for _, c := range strings.Split(parts[1], ",") {
			own[c] = parts[2]
		}
	}
	return own, nil
}

// cgroupV2Root is where the unified hierarchy is mounted: cgroupFS, or
// its unified/ on a machine that mounts both versions; "" when neither.
func cgroupV2Root() string {
	for _, p := range []string{cgroupFS, filepath.Join(cgroupFS, "unified")} {
		if _, err := os.Stat(filepath.Join(p, "cgroup.controllers")); err == nil {
			return p
		}
	}
	return ""
}

// runnable returns the path by which a pool uid runs the worker program
// exe: exe itself, or a copy where other uids cannot reach it (made once
// per program). Without a uid pool it is exe.
func (iso *isolation) runnable(exe string) (string, error) {
	if len(iso.uids) == 0 {
		return exe, nil
	}
	iso.emu.Lock()
	defer iso.emu.Unlock()
	if p, ok := iso.exes[exe]; ok {
		return p, nil
	}
	p, err := box.Executable(exe)
	if err != nil {
		return "", err
	}
	if iso.exes == nil {
		iso.exes = map[string]string{}
	}
	iso.exes[exe] = p
	return p, nil
}

// wrapperProgram is the program of a worker wrapper to bind into the
// sandbox: its first absolute path (its arguments are not bound).
func wrapperProgram(wrapper []string) []string {
	for _, p := range wrapper {
		if filepath.IsAbs(p) && !strings.HasPrefix(p, "/usr/") {
			return []string{p}
		}
	}
	return nil
}

// takeUID gives a session a uid of the pool (-1 when there is no pool).
func (iso *isolation) takeUID() (int, error) {
	if len(iso.uids) == 0 {
		return -1, nil
	}
	iso.umu.Lock()
	defer iso.umu.Unlock()
	for _, u := range iso.uids {
		if !iso.uidUsed[u] {
			iso.uidUsed[u] = true
			return u, nil
		}
	}
	return -1, fmt.Errorf("every worker uid (--worker-uids, %d of them) is in use", len(iso.uids))
}

// uidWait bounds how long a session waits for a uid that an ended
// session gives back: the device's slot is free once a session ends, its
// uid only once its worker has been reaped, so the next session (the one
// the tracker grants the freed lease to at once) may open in between.
const uidWait = 10 * time.Second

// takeUIDWait is takeUID waiting up to wait for a uid to be given back.
func (iso *isolation) takeUIDWait(wait time.Duration) (int, error) {
	deadline := time.Now().Add(wait)
	for {
		u, err := iso.takeUID()
		left := time.Until(deadline)
		if err == nil || left <= 0 {
			return u, err
		}
		iso.umu.Lock()
		if iso.uidFreed == nil {
			iso.uidFreed = make(chan struct{})
		}
		freed := iso.uidFreed
		iso.umu.Unlock()
		t := time.NewTimer(left)
		select {
		case <-freed:
		case <-t.C:
		}
		t.Stop()
	}
}

// giveUID returns a uid to the pool once no process of it is left.
func (iso *isolation) giveUID(u int) {
	if u < 0 {
		return
	}
	iso.umu.Lock()
	defer iso.umu.Unlock()
	delete(iso.uidUsed, u)
	if iso.uidFreed != nil {
		close(iso.uidFreed)
		iso.uidFreed = nil
	}
}

// command returns the argv that runs a worker (wrapper, path, args) for
// session directory dir: inside bubblewrap when sandboxed, joining the
// session's cgroups first, or under prlimit for the caps.
func (iso *isolation) command(dir string, cg []string, uid int, wrapper []string, path string, args []string) []string {
	argv := append(append(append([]string{}, wrapper...), path), args...)
	if iso.bwrap != "" {
		// The session directory is a tmpfs of the session's quota in the
		// sandbox, with the uploads (files/) bound read-only from the
		// host: whatever the worker and its kernels write is capped.
		argv = append(append([]string{iso.bwrap}, box.CappedArgs(dir, path, wrapperProgram(wrapper), iso.quota,
			[]string{filepath.Join(dir, "files")}, []string{filepath.Join(dir, "modules")})...), argv...)
	} else if iso.capMount != "" {
		// The same cap without the sandbox: the session mounter makes the
		// session directory a tmpfs of the quota in the worker's own
		// mount namespace (spawnWorker makes the namespaces).
		argv = append(capMountArgs(iso.capMount, iso.quota, dir), argv...)
	}
	if uid > 0 {
		argv = append(box.DropArgs(iso.setpriv, uid), argv...)
	}
	if iso.prlimit != "" {
		pre := []string{iso.prlimit}
		if iso.procs > 0 {
			pre = append(pre, "--nproc="+strconv.Itoa(iso.procs))
		}
		argv = append(append(pre, "--"), argv...)
	}
	if len(cg) > 0 {
		// The shell writes its own pid into each cgroup, then becomes the
		// worker's command: every process of the session starts inside.
		const script = `n=$1; shift; while [ "$n" -gt 0 ]; do echo $$ > "$1" || exit 125; shift; n=$((n-1)); done; exec "$@"`
		pre := append([]string{"/bin/sh", "-c", script, "kiln-worker", strconv.Itoa(len(cg))}, cg...)
		argv = append(pre, argv...)
	}
	return argv
}

// sessionCgroups makes the cgroups of one session and caps them; it
// returns their cgroup.procs files.
func (iso *isolation) sessionCgroups(id string) ([]string, error) {
	var procs []string
	for _, d := range iso.cgroups {
		p := filepath.Join(d.path, id)
		if err := os.Mkdir(p, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
			iso.removeCgroups(id)
			return nil, fmt.Errorf("session cgroup: %w", err)
		}
		if d.memory != "" && iso.memory > 0 {
			if err := os.WriteFile(filepath.Join(p, d.memory), []byte(strconv.FormatInt(iso.memory, 10)), 0); err != nil {
				iso.removeCgroups(id)
				return nil, fmt.Errorf("session cgroup: memory cap: %w", err)
			}
		}
		if d.swap != "" && iso.memory > 0 {
			v := "0"
			if d.swap == "memory.memsw.limit_in_bytes" {
				v = strconv.FormatInt(iso.memory, 10)
			}
			if err := os.WriteFile(filepath.Join(p, d.swap), []byte(v), 0); err != nil && !errors.Is(err, os.ErrNotExist) {
				iso.removeCgroups(id)
				return nil, fmt.Errorf("session cgroup: swap cap: %w", err)
			}
		}
		if d.procs != "" && iso.procs > 0 {
			if err := os.WriteFile(filepath.Join(p, d.procs), []byte(strconv.Itoa(iso.procs)), 0); err != nil {
				iso.removeCgroups(id)
				return nil, fmt.Errorf("session cgroup: process cap: %w", err)
			}
		}
		procs = append(procs, filepath.Join(p, "cgroup.procs"))
	}
	return procs, nil
}

// oomKilled says whether the kernel killed a process of session id's
// cgroups for want of memory.
func (iso *isolation) oomKilled(id string) bool {
	for _, d := range iso.cgroups {
		if d.oom == "" {
			continue
		}
		f, err := os.Open(filepath.Join(d.path, id, d.oom))
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if k, v, ok := strings.Cut(sc.Text(), " "); ok && k == "oom_kill" && v != "0" {
				f.Close()
				return true
			}
		}
		f.Close()
	}
	return false
}

// removeCgroups removes session id's cgroups (empty once its processes
// are gone; a moment after the worker's exit the last ones may linger).
func (iso *isolation) removeCgroups(id string) {
	for _, d := range iso.cgroups {
		p := filepath.Join(d.path, id)
		for i := 0; i < 50; i++ {
			err := syscall.Rmdir(p)
			if err == nil || errors.Is(err, syscall.ENOENT) {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// close removes the daemon's cgroup directories.
func (iso *isolation) close() {
	for _, d := range iso.cgroups {
		syscall.Rmdir(d.path)
	}
}

// cgroupFS is where the cgroup hierarchies are mounted (a variable for
// the tests of a daemon without them).
var cgroupFS = "/sys/fs/cgroup"

// cgroupSeq tells apart the cgroup directories of daemons in one process.
var cgroupSeq atomic.Int64

// makeCgroupDirs makes a directory for the daemon's session cgroups under
// its own cgroup, for memory and pids: in the unified hierarchy (cgroup
// v2) where both controllers are delegated to it, else in the v1
// hierarchies. It returns none when it cannot (not root, no delegation).
func makeCgroupDirs(log func(msg string, args ...any)) []cgroupDir {
	own, err := ownCgroups() // controller ("" for v2) → the daemon's cgroup path
	if err != nil {
		return nil
	}
	name := fmt.Sprintf("kiln-rpcserver-%d-%d", os.Getpid(), cgroupSeq.Add(1))
	mk := func(base string) (string, bool) {
		removeStaleCgroups(base)
		p := filepath.Join(base, name)
		if err := os.Mkdir(p, 0o700); err != nil {
			return "", false
		}
		return p, true
	}
	// cgroup v2: memory and pids enabled for the daemon's cgroup's children.
	if rel, ok := own[""]; ok && cgroupV2Root() != "" {
		base := filepath.Join(cgroupV2Root(), rel)
		if filepath.Base(base) == daemonLeaf() {
			base = filepath.Dir(base) // moved there by an earlier daemon of this process
		} else {
			delegate(base)
		}
		if ctl, err := os.ReadFile(filepath.Join(base, "cgroup.subtree_control")); err == nil &&
			strings.Contains(string(ctl), "memory") && strings.Contains(string(ctl), "pids") {
			if p, ok := mk(base); ok {
				// Children of p need the controllers enabled in p too.
				if os.WriteFile(filepath.Join(p, "cgroup.subtree_control"), []byte("+memory +pids"), 0) == nil {
					return []cgroupDir{{path: p, memory: "memory.max", procs: "pids.max", oom: "memory.events", swap: "memory.swap.max"}}
				}
				syscall.Rmdir(p)
			}
		}
	}
	// cgroup v1: one hierarchy per controller.
	var dirs []cgroupDir
	for _, c := range []struct{ ctl, memory, procs, oom, swap string }{
		{"memory", "memory.limit_in_bytes", "", "memory.oom_control", "memory.memsw.limit_in_bytes"},
		{"pids", "", "pids.max", "", ""},
	} {
		rel, ok := own[c.ctl]
		if !ok {
			continue
		}
		base := ""
		for _, cand := range []string{filepath.Join(cgroupFS, c.ctl, rel), filepath.Join(cgroupFS, c.ctl)} {
			if fi, err := os.Stat(cand); err == nil && fi.IsDir() {
				base = cand
				break
			}
		}
		if base == "" {
			continue
		}
		if p, ok := mk(base); ok {
			dirs = append(dirs, cgroupDir{path: p, memory: c.memory, procs: c.procs, oom: c.oom, swap: c.swap})
		}
	}
	if len(dirs) == 0 && log != nil {
		log("no cgroup for session caps")
	}
	return dirs
}

// daemonLeaf is the name of the cgroup this process moves itself into,
// under a delegated cgroup (see delegate).
func daemonLeaf() string { return fmt.Sprintf("kiln-rpcserver-%d-daemon", os.Getpid()) }

// delegate readies a cgroup v2 base that is delegated to the daemon's user
// (systemd's Delegate=yes: the daemon may write its files) for session
// cgroups below it: a cgroup with processes cannot enable controllers for
// its children, so the daemon moves itself into a leaf of its own below
// base and then enables memory and pids in base. It does nothing where
// base has them enabled already, lacks them, or is not writable.
func delegate(base string) {
	has := func(file string) bool {
		b, err := os.ReadFile(filepath.Join(base, file))
		f := strings.Fields(string(b))
		return err == nil && slices.Contains(f, "memory") && slices.Contains(f, "pids")
	}
	if has("cgroup.subtree_control") || !has("cgroup.controllers") {
		return
	}
	if syscall.Access(filepath.Join(base, "cgroup.subtree_control"), 2 /* W_OK */) != nil {
		return
	}
	leaf := filepath.Join(base, daemonLeaf())
	if err := os.Mkdir(leaf, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return
	}
	pid := []byte(strconv.Itoa(os.Getpid()))
	if os.WriteFile(filepath.Join(leaf, "cgroup.procs"), pid, 0) != nil {
		syscall.Rmdir(leaf)
		return
	}
	if os.WriteFile(filepath.Join(base, "cgroup.subtree_control"), []byte("+memory +pids"), 0) != nil {
		// Other processes share base: go back where we were.
		os.WriteFile(filepath.Join(base, "cgroup.procs"), pid, 0)
		syscall.Rmdir(leaf)
	}
}

// removeStaleCgroups removes the session cgroups left under base by
// daemons that died without cleaning up (kill -9): those whose process is
// gone, and which no process uses any more.
func removeStaleCgroups(base string) {
	dirs, _ := filepath.Glob(filepath.Join(base, "kiln-rpcserver-*"))
	for _, d := range dirs {
		num, _, _ := strings.Cut(strings.TrimPrefix(filepath.Base(d), "kiln-rpcserver-"), "-")
		pid, err := strconv.Atoi(num)
		if err != nil || pid <= 0 || syscall.Kill(pid, 0) != syscall.ESRCH {
			continue
		}
		subs, _ := os.ReadDir(d)
		for _, e := range subs {
			if e.IsDir() {
				syscall.Rmdir(filepath.Join(d, e.Name()))
			}
		}
		syscall.Rmdir(d)
	}
}

// checkRunnable refuses, before bubblewrap starts it, a program this
// machine cannot execute: an ELF binary for another machine than
// bubblewrap's own. (Inside the sandbox the exec would fail with a shell's
// syntax error instead: execvp hands a file it cannot run to /bin/sh.)
func (iso *isolation) checkRunnable(program string) error {
	if iso.bwrap == "" {
		return nil
	}
	path, err := exec.LookPath(program)
	if err != nil {
		return err
	}
	theirs, err := elfMachine(path)
	if err != nil {
		return nil // not an ELF file (a script): the kernel decides
	}
	ours, err := elfMachine(iso.bwrap)
	if err != nil || theirs == ours {
		return nil
	}
	return fmt.Errorf("%s: exec format error: it is a binary for %s, and this machine runs %s binaries", path, theirs, ours)
}

// elfMachine returns the machine an ELF file is built for.
func elfMachine(path string) (elf.Machine, error) {
	f, err := elf.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	return f.Machine, nil
}
