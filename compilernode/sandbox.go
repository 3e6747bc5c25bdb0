package compilernode

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/kiln-ml/kiln/internal/sandbox"
)

// Sandbox modes (Config.Sandbox).
const (
	// SandboxAuto runs build jobs in bubblewrap's sandbox where it works
	// on this machine, and says at start when it does not.
	SandboxAuto = "auto"
	// SandboxBwrap runs build jobs in bubblewrap's sandbox, or Run fails.
	SandboxBwrap = "bwrap"
	// SandboxOff runs build jobs as the node's user, in its namespaces
	// (with a scrubbed environment still).
	SandboxOff = "off"
)

// Defaults of the caps on one build job's processes.
const (
	DefaultMaxJobMemory = 8 << 30
	DefaultMaxJobProcs  = 256
)

// autoUIDOffset is where a root compiler node's job uids start in the
// automatic range, past those of device daemons' workers.
const autoUIDOffset = 1 << 20

// jail is how the node confines its build jobs, decided once by Run.
type jail struct {
	bwrap   string // "" when jobs are not sandboxed
	why     string // why they are not
	setpriv string
	prlimit string
	uids    chan int // free job uids (root only)
	ro      []string // toolchain directories bound read-only
	// exe is the job command's program as a job uid can run it (a copy
	// when the node's binary lies where other uids cannot reach it); ""
	// unless the node is root and sandboxes its jobs.
	exe    string
	memory int64
	procs  int
}

// newJail decides how build jobs run: in bubblewrap's sandbox (as a uid of
// their own when the node is root), under prlimit's caps.
func newJail(ctx context.Context, cfg Config, work string) (*jail, error) {
	j := &jail{memory: cfg.MaxJobMemory, procs: cfg.MaxJobProcs}
	if j.memory == 0 {
		j.memory = DefaultMaxJobMemory
	}
	if j.procs == 0 {
		j.procs = DefaultMaxJobProcs
	}
	j.memory, j.procs = max(j.memory, 0), max(j.procs, 0)
	mode := cfg.Sandbox
	if mode == "" {
		mode = SandboxAuto
	}
	switch mode {
	case SandboxOff:
		j.why = "sandboxing is off (--sandbox off)"
	case SandboxAuto, SandboxBwrap:
		root := os.Geteuid() == 0
		uids := sandbox.AutoUIDsFrom(autoUIDOffset, cfg.Concurrency)
		path, err := sandbox.Find()
		if err == nil && root {
			j.setpriv, err = sandbox.FindSetpriv()
		}
		if err == nil && root {
			// Job uids pass through the work directory to their own.
			err = os.Chmod(work, 0o711)
		}
		if err == nil {
			uid := -1
			if root {
				uid = uids[0]
			}
			err = sandbox.Probe(ctx, path, j.setpriv, work, uid)
		}
		program := cfg.Command[0]
		if err == nil && root {
			// The jobs' uids must be able to run the node's binary,
			// wherever it was installed.
			if program, err = exec.LookPath(program); err == nil {
				program, err = sandbox.Executable(program)
			}
		}
		if err == nil {
			err = j.checkCommand(ctx, path, work, program, uids[0], root)
		}
		if err != nil {
			if mode == SandboxBwrap {
				return nil, fmt.Errorf("compiler node: --sandbox bwrap: %w", err)
			}
			j.why = err.Error()
			if root {
				os.Chmod(work, 0o700)
			}
			break
		}
		j.bwrap = path
		if root {
			j.exe = program
			j.uids = make(chan int, len(uids))
			for _, u := range uids {
				j.uids <- u
			}
		}
		j.ro = toolchainDirs(cfg.Toolchains)
	default:
		return nil, fmt.Errorf("compiler node: --sandbox %q: want auto, bwrap or off", mode)
	}
	if j.memory > 0 || j.procs > 0 {
		if p, err := exec.LookPath("prlimit"); err == nil {
			j.prlimit = p
		} else if j.bwrap != "" {
			return nil, fmt.Errorf("compiler node: capping build jobs' memory and processes needs the prlimit command (util-linux)")
		}
	}
	if j.uids == nil {
		// RLIMIT_NPROC counts every process of the uid: without a uid of
		// the job's own it would count the node's user's others.
		j.procs = 0
	}
	return j, nil
}

// checkCommand runs the job command's program in the sandbox far enough
// to see that it can (a program the job uid cannot reach fails here, not
// at the first job).
func (j *jail) checkCommand(ctx context.Context, bwrap, work, program string, uid int, root bool) error {
	path, err := exec.LookPath(program)
	if err != nil {
		return fmt.Errorf("job command: %w", err)
	}
	dir, err := os.MkdirTemp(work, "probe-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	test, err := exec.LookPath("test")
	if err != nil {
		return err
	}
	argv := append(append([]string{bwrap}, sandbox.Args(dir, path, nil)...), test, "-x", path)
	if root {
		os.Chown(dir, uid, uid)
		argv = append(sandbox.DropArgs(j.setpriv, uid), argv...)
	}
	out, err := exec.CommandContext(ctx, argv[0], argv[1:]...).CombinedOutput()
	if err != nil {
		who := "the sandbox"
		if root {
			who = "job uid " + strconv.Itoa(uid)
		}
		return fmt.Errorf("the job command %s cannot be run by %s (is every directory above it searchable?): %v %s", path, who, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// toolchainDirs are the directories of configured C compilers outside
// /usr (a cross toolchain in /opt/cross: its bin directory's parent).
func toolchainDirs(toolchains map[string]string) []string {
	var dirs []string
	for _, cmd := range append(mapValues(toolchains), os.Getenv("CC")) {
		f := strings.Fields(cmd)
		if len(f) == 0 || !filepath.IsAbs(f[0]) {
			continue
		}
		d := filepath.Dir(filepath.Dir(f[0]))
		if d != "/" {
			dirs = append(dirs, d)
		}
	}
	return dirs
}

func mapValues(m map[string]string) []string {
	var v []string
	for _, s := range m {
		v = append(v, s)
	}
	return v
}

// jobEnv is a build job's whole environment: what finds the C compiler
// and NVRTC, the operator's additions, nothing else of the node's (its
// token and credential stay out).
func jobEnv(cfg Config, dir string, boxed bool) []string {
	tmp := os.TempDir()
	if boxed {
		tmp = "/tmp"
	}
	env := []string{"PATH=" + envOr("PATH", "/usr/local/bin:/usr/bin:/bin"), "HOME=" + dir, "TMPDIR=" + tmp}
	for _, k := range []string{"CC", "LD_LIBRARY_PATH"} {
		if v, ok := os.LookupEnv(k); ok {
			env = append(env, k+"="+v)
		}
	}
	return append(env, cfg.JobEnv...)
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// take gives a job a uid (-1 when jobs run as the node's user).
func (j *jail) take(ctx context.Context) (int, error) {
	if j.uids == nil {
		return -1, nil
	}
	select {
	case u := <-j.uids:
		return u, nil
	case <-ctx.Done():
		return -1, ctx.Err()
	}
}

// give returns a job's uid.
func (j *jail) give(u int) {
	if u >= 0 {
		j.uids <- u
	}
}

// command returns the argv of a job's command run for job directory dir,
// as uid when uid > 0; the directory becomes the uid's.
func (j *jail) command(dir string, uid int, timeoutSec int64, command []string) ([]string, error) {
	argv := append([]string{}, command...)
	argv = append(argv, dir)
	if j.bwrap == "" {
		return j.capped(argv, timeoutSec), nil
	}
	path := j.exe
	if path == "" {
		var err error
		if path, err = exec.LookPath(command[0]); err != nil {
			return nil, fmt.Errorf("job command: %w", err)
		}
	}
	argv[0] = path
	argv = append(append([]string{j.bwrap}, sandbox.Args(dir, path, j.ro)...), argv...)
	if uid > 0 {
		err := filepath.WalkDir(dir, func(p string, _ fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			return os.Lchown(p, uid, uid)
		})
		if err != nil {
			return nil, fmt.Errorf("give the job directory to uid %d: %w", uid, err)
		}
		argv = append(sandbox.DropArgs(j.setpriv, uid), argv...)
	}
	return j.capped(argv, timeoutSec), nil
}

// capped puts argv under prlimit's caps: memory, processes and CPU time.
func (j *jail) capped(argv []string, timeoutSec int64) []string {
	if j.prlimit == "" {
		return argv
	}
	pre := []string{j.prlimit}
	if j.memory > 0 {
		pre = append(pre, "--as="+strconv.FormatInt(j.memory, 10))
	}
	if j.procs > 0 {
		pre = append(pre, "--nproc="+strconv.Itoa(j.procs))
	}
	if timeoutSec > 0 {
		pre = append(pre, "--cpu="+strconv.FormatInt(timeoutSec, 10))
	}
	return append(append(pre, "--"), argv...)
}
