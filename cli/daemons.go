package cli

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	ucli "github.com/urfave/cli/v2"

	"github.com/kiln-ml/kiln/client"
	"github.com/kiln-ml/kiln/compilernode"
	"github.com/kiln-ml/kiln/devices"
	"github.com/kiln-ml/kiln/devices/cpu"
	"github.com/kiln-ml/kiln/devices/cuda"
	"github.com/kiln-ml/kiln/rpcserver"
	"github.com/kiln-ml/kiln/rpcserver/proto"
	"github.com/kiln-ml/kiln/tracker"
)

func trackerCommand() *ucli.Command {
	return &ucli.Command{
		Name:      "tracker",
		Usage:     "run the tracker: registry of devices and compiler nodes, leases, build jobs",
		UsageText: "kiln tracker --data DIR [--listen ADDR] [--tvm-listen ADDR] [--metrics-listen ADDR] [--ui-listen ADDR] [--token-file F]",
		Description: `Runs the fleet's coordinator until SIGINT/SIGTERM. Device daemons and compiler
nodes register with it and keep a heartbeat; clients ask it for devices (by
key or attribute selector, e.g. "cuda.compute>=8.0") and get leases; build
jobs are queued durably in DIR/tracker.db (bbolt) and handed to compiler
nodes; artifacts are stored by sha256 in DIR/artifacts, or where --artifacts
says (another directory, or an S3-compatible bucket). A restart loses no
submitted job (running ones are requeued).

With --store etcd://h1:2379,h2:2379,h3:2379 the state lives in etcd and
several trackers given the same store and token are replicas of one tracker:
one is elected to lead and serves; the others accept every connection (kiln
and TVM protocols) and forward it to the leader; when the leader dies another
takes over within about two seconds, from etcd's state; a store reached over
plain http is refused unless --store-insecure. --cluster-name and
--cluster-peers run an embedded etcd member beside each tracker instead, so
three trackers form their own etcd cluster; its peer and client URLs speak
mutual TLS only (https; the peers' CA is derived from the fleet token unless
--tls-cert, --tls-key and --tls-client-ca are given).

--tvm-listen opens a second listener speaking Apache TVM's tracker protocol,
so TVM's rpc servers and tuning runners can use this tracker unchanged (that
protocol has no authentication: bind it to a trusted network).

Examples:
   kiln tracker --data /var/lib/kiln --listen 0.0.0.0:9190
   kiln tracker --data ./t --tvm-listen 127.0.0.1:9191 --metrics-listen 127.0.0.1:9192
   kiln tracker --data ./t --users-file users --ui-listen 127.0.0.1:9180
   kiln tracker --data /var/lib/kiln --listen 0.0.0.0:9190 --token-file tok --store etcd://h1:2379,h2:2379,h3:2379
   kiln tracker --data /var/lib/kiln --listen 0.0.0.0:9190 --token-file tok --advertise h1:9190 --cluster-name a --cluster-peers a=https://h1:2380,b=https://h2:2380,c=https://h3:2380
   kiln tracker --data ./t --artifacts 's3://kiln-artifacts?endpoint=http://127.0.0.1:8333'`,
		Flags: append([]ucli.Flag{
			&ucli.StringFlag{Name: "listen", Value: "127.0.0.1:9190", Usage: "address of the kiln protocol listener"},
			&ucli.StringFlag{Name: "data", Required: true, Usage: "directory for tracker.db and the artifacts"},
			&ucli.StringFlag{Name: "artifacts", Usage: "where artifacts are kept: a directory (default DATA/artifacts; trackers may share one on a ReadWriteMany volume) or an S3-compatible bucket, s3://BUCKET[/PREFIX]?endpoint=http://HOST:PORT[&region=R], with credentials from AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, the AWS credentials file or an IAM role"},
			&ucli.StringFlag{Name: "tvm-listen", Usage: "address of an Apache TVM tracker-protocol listener"},
			&ucli.StringFlag{Name: "tvm-stop-key", Usage: "key a TVM STOP message must carry to stop the tracker (none: STOP refused)"},
			&ucli.DurationFlag{Name: "tvm-idle-timeout", Value: tracker.DefaultTVMIdleTimeout, Usage: "close a TVM-protocol connection silent this long that waits for no server"},
			&ucli.IntFlag{Name: "tvm-max-conns-per-peer", Value: tracker.DefaultTVMMaxConnsPerPeer, Usage: "TVM-protocol connections one peer (IP address) may hold at once"},
			&ucli.StringFlag{Name: "metrics-listen", Usage: "HTTP address serving Prometheus /metrics"},
			&ucli.DurationFlag{Name: "heartbeat", Value: 2 * time.Second, Usage: "heartbeat interval nodes are told to keep"},
			&ucli.IntFlag{Name: "max-queued-jobs", Value: 256, Usage: "build jobs that may wait in the queue at once"},
			&ucli.IntFlag{Name: "max-queued-jobs-per-user", Value: 64, Usage: "build jobs one named user (--users-file) may have queued at once"},
			&ucli.IntFlag{Name: "max-results-per-user", Value: 10000, Usage: "results one user may keep in the results store (kiln results); recording past it evicts their oldest"},
			&ucli.IntFlag{Name: "max-module-size", Value: 32 << 20, Usage: "bytes of one build job's module (a module over 1 MiB is streamed into the module store; over etcd at most 1 MiB)"},
			&ucli.Int64Flag{Name: "max-queued-bytes", Value: 512 << 20, Usage: "bytes of module text the queued jobs, and the submissions arriving, may hold (in the module store beside the artifacts, or etcd)"},
			&ucli.Int64Flag{Name: "max-queued-bytes-per-user", Usage: "bytes of module text one named user's queued jobs may hold (default a quarter of --max-queued-bytes)"},
			&ucli.DurationFlag{Name: "max-job-queue-timeout", Value: 24 * time.Hour, Usage: "longest a build job may ask to wait in the queue"},
			&ucli.DurationFlag{Name: "max-job-run-timeout", Value: time.Hour, Usage: "longest a build job may ask to run on a compiler node"},
			&ucli.StringFlag{Name: "users-file", Usage: "file of named user tokens (clients), join tokens and node revocations (kiln token); re-read when it changes. A node presents a join token once and gets its own credential, bound to its node id and role"},
			&ucli.DurationFlag{Name: "credential-ttl", Value: 30 * 24 * time.Hour, Usage: "how long a node credential admits its node after its last use (a hello or heartbeat renews it); past it the node must join again"},
			&ucli.DurationFlag{Name: "job-orphan-grace", Value: 30 * time.Second, Usage: "how long a queued build job submitted to be cancelled with its client (kiln tune's candidates) outlives its client's connection before it is cancelled, unless the client waits for it again"},
			&ucli.DurationFlag{Name: "job-retention", Value: 7 * 24 * time.Hour, Usage: "how long a finished build job is kept (status, query) before it is forgotten"},
			&ucli.Int64Flag{Name: "max-artifact-bytes", Value: 10 << 30, Usage: "size of the artifact store; the least recently used artifacts are evicted to stay within it, from owners over an equal share of it only"},
			&ucli.Int64Flag{Name: "max-artifact-bytes-per-user", Usage: "one owner's share of the artifact store (default a quarter of --max-artifact-bytes): past it, their own least recently used artifacts are evicted; uploads in flight count against it"},
			consoleFlag(),
			insecureFlag(),
		}, append(listenFlags(), trackerHAFlags()...)...),
		OnUsageError: usageError,
		Action:       runTracker,
	}
}

func runTracker(c *ucli.Context) error {
	if err := noArgs(c); err != nil {
		return err
	}
	tok, tlsCfg, err := serverAuth(c)
	if err != nil {
		return err
	}
	cfg := tracker.Config{
		Listen: c.String("listen"), DataDir: c.String("data"), Artifacts: c.String("artifacts"),
		TVMListen: c.String("tvm-listen"), TVMStopKey: c.String("tvm-stop-key"),
		TVMIdleTimeout: c.Duration("tvm-idle-timeout"), TVMMaxConnsPerPeer: c.Int("tvm-max-conns-per-peer"),
		MetricsListen: c.String("metrics-listen"), Token: tok, TLS: tlsCfg,
		HeartbeatInterval: c.Duration("heartbeat"), Logger: logger(c), Insecure: c.Bool("insecure"),
		MaxQueuedJobs: c.Int("max-queued-jobs"), MaxQueuedBytes: c.Int64("max-queued-bytes"), MaxModuleSize: c.Int("max-module-size"),
		MaxQueuedJobsPerUser: c.Int("max-queued-jobs-per-user"), MaxQueuedBytesPerUser: c.Int64("max-queued-bytes-per-user"),
		MaxArtifactBytesPerUser: c.Int64("max-artifact-bytes-per-user"),
		MaxResultsPerUser:       c.Int("max-results-per-user"),
		MaxJobQueueTimeout:      c.Duration("max-job-queue-timeout"), MaxJobRunTimeout: c.Duration("max-job-run-timeout"),
		JobRetention: c.Duration("job-retention"), JobOrphanGrace: c.Duration("job-orphan-grace"), MaxArtifactBytes: c.Int64("max-artifact-bytes"),
		UsersFile: c.String("users-file"), CredentialTTL: c.Duration("credential-ttl"),
	}
	if err := trackerHA(c, &cfg); err != nil {
		return err
	}
	if err := checkConsole(c, cfg); err != nil {
		return fmt.Errorf("tracker: %w", err)
	}
	srv, err := tracker.New(cfg)
	if err != nil {
		return fmt.Errorf("tracker: %w", err)
	}
	fmt.Fprintf(c.App.ErrWriter, "kiln tracker listening on %s", srv.Addr())
	if a := srv.TVMAddr(); a != "" {
		fmt.Fprintf(c.App.ErrWriter, ", TVM protocol on %s", a)
	}
	if a := srv.MetricsAddr(); a != "" {
		fmt.Fprintf(c.App.ErrWriter, ", metrics on http://%s/metrics", a)
	}
	fmt.Fprintln(c.App.ErrWriter)
	ctx, cancel := context.WithCancel(c.Context)
	defer cancel()
	wait, err := startConsole(ctx, c, srv, cfg)
	if err != nil {
		srv.Close()
		return fmt.Errorf("tracker: %w", err)
	}
	err = srv.Run(ctx)
	cancel()
	if cerr := wait(); err == nil && cerr != nil {
		err = fmt.Errorf("console: %w", cerr)
	}
	return err
}

func compilerCommand() *ucli.Command {
	return &ucli.Command{
		Name:      "compiler",
		Usage:     "run a compiler node that builds the tracker's build jobs",
		UsageText: "kiln compiler --tracker HOST:PORT [--jobs N] [--toolchain TRIPLE=COMMAND]... [--token-file F] [--metrics-listen ADDR]",
		Description: `Registers with the tracker what this machine can build (targets, the C
compiler's identity, cross compilers found, NVRTC/nvcc), then takes build
jobs from the queue until SIGINT/SIGTERM. Each job is built in a subprocess
of this binary under the job's time limit, so a crashing or hung compiler
costs one job, never the node; the artifact is uploaded to the tracker, or
the job fails with the compiler's message.

Cross compilers are found by themselves: TRIPLE-gcc on PATH for every
*-linux-gnu* triple (Debian's gcc-aarch64-linux-gnu, gcc-riscv64-linux-gnu),
and clang --target=TRIPLE for aarch64, riscv64 and x86_64 Linux when clang
is installed; --toolchain names one more, or another, for a triple. Each is
checked by building an empty shared object; one that fails is left out with
a warning naming what it printed (a --toolchain that fails stops the node).
The node advertises "cpu -mtriple=TRIPLE" for each, and the tracker gives it
only jobs for targets it builds.

Examples:
   kiln compiler --tracker 127.0.0.1:9190
   kiln compiler --tracker tracker:9190 --jobs 4 --token-file /run/secrets/token
   kiln compiler --tracker tracker:9190 --toolchain aarch64-linux-gnu=/opt/cross/bin/aarch64-linux-gnu-gcc
   kiln compiler --tracker tracker:9190 --toolchain "riscv64-linux-gnu=clang --target=riscv64-linux-gnu"`,
		Flags: append([]ucli.Flag{
			trackerFlag("HOST:PORT of the tracker", true),
			&ucli.IntFlag{Name: "jobs", Value: 1, Usage: "builds run at once"},
			&ucli.StringFlag{Name: "work-dir", Usage: "directory for job files (default: a temporary directory)"},
			&ucli.StringFlag{Name: "sandbox", Value: compilernode.SandboxAuto, Usage: "how build jobs are confined: auto (bubblewrap when it works here, else none, said at start), bwrap (bubblewrap or refuse to start), off"},
			&ucli.StringSliceFlag{Name: "job-env", Usage: "NAME=VALUE set in each build job's environment (repeatable); jobs inherit only PATH, CC and LD_LIBRARY_PATH of the node's own variables"},
			&ucli.StringFlag{Name: "max-job-memory", Usage: "address-space cap of a build job's processes, e.g. 16GiB (default: 8GiB; 0: none)"},
			&ucli.IntFlag{Name: "max-job-procs", Usage: "process cap of a build job, where it runs as a uid of its own (default: 256)"},
			&ucli.StringSliceFlag{Name: "target", Usage: "target kinds this node builds: cpu, cuda (default: cpu, and cuda where NVRTC is installed)"},
			&ucli.StringSliceFlag{Name: "toolchain", Usage: "TRIPLE=COMMAND: the C compiler for a target triple (repeatable; COMMAND may carry arguments)"},
			&ucli.StringFlag{Name: "metrics-listen", Usage: "HTTP address serving Prometheus /metrics"},
			credentialFlag(),
		}, connFlags()...),
		OnUsageError: usageError,
		Action:       runCompilerNode,
	}
}

func runCompilerNode(c *ucli.Context) error {
	if err := noArgs(c); err != nil {
		return err
	}
	tok, tlsCfg, err := clientAuth(c)
	if err != nil {
		return err
	}
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("compiler: %w", err)
	}
	targets, err := compilerTargets(c.StringSlice("target"))
	if err != nil {
		return fmt.Errorf("compiler: %w", err)
	}
	toolchains := map[string]string{}
	for _, tc := range c.StringSlice("toolchain") {
		triple, cmd, ok := strings.Cut(tc, "=")
		triple, cmd = strings.TrimSpace(triple), strings.TrimSpace(cmd)
		if !ok || triple == "" || cmd == "" || strings.ContainsAny(triple, " \t") || strings.Count(triple, "-") < 1 {
			return fmt.Errorf("compiler: --toolchain %q: want TRIPLE=COMMAND, e.g. aarch64-linux-gnu=/usr/bin/aarch64-linux-gnu-gcc", tc)
		}
		if _, dup := toolchains[triple]; dup {
			return fmt.Errorf("compiler: --toolchain: triple %s given twice", triple)
		}
		toolchains[triple] = cmd
	}
	mem := int64(0)
	if v := c.String("max-job-memory"); v != "" {
		if mem, err = parseByteSize(v); err != nil {
			return fmt.Errorf("compiler: --max-job-memory: %w", err)
		}
		if mem == 0 {
			mem = -1
		}
	}
	warnFleetToken(logger(c), "compiler node", tok, c.String("credential-file"))
	return compilernode.Run(c.Context, compilernode.Config{
		Sandbox:       c.String("sandbox"),
		JobEnv:        c.StringSlice("job-env"),
		MaxJobMemory:  mem,
		MaxJobProcs:   c.Int("max-job-procs"),
		Toolchains:    toolchains,
		Tracker:       c.String("tracker"),
		Options:       client.TrackerOptions{Token: tok, TLS: tlsCfg, Logger: logger(c), CredentialFile: c.String("credential-file")},
		Command:       []string{exe, "compiler-job"},
		WorkDir:       c.String("work-dir"),
		Concurrency:   c.Int("jobs"),
		Targets:       targets,
		Version:       Version(),
		Logger:        logger(c),
		MetricsListen: c.String("metrics-listen"),
	})
}

// compilerTargets are the target kinds a compiler node builds: those asked
// for, each checked (cuda needs NVRTC here), or cpu and, where NVRTC loads,
// cuda (building for a GPU needs no GPU).
func compilerTargets(asked []string) ([]string, error) {
	_, nvrtcErr := cuda.NVRTC{}.Identity()
	if len(asked) == 0 {
		if nvrtcErr != nil {
			return []string{"cpu"}, nil
		}
		return []string{"cpu", "cuda"}, nil
	}
	for _, t := range asked {
		if proto.TargetKind(t) == "cuda" && nvrtcErr != nil {
			return nil, fmt.Errorf("--target %s: building for cuda needs NVRTC on this machine: %w", t, nvrtcErr)
		}
	}
	return asked, nil
}

// compilerJobCommand is the hidden subprocess of a compiler node.
func compilerJobCommand() *ucli.Command {
	return &ucli.Command{
		Name:      "compiler-job",
		Hidden:    true,
		Usage:     "build one job directory (run by kiln compiler)",
		UsageText: "kiln compiler-job DIR",
		Action: func(c *ucli.Context) error {
			if c.NArg() != 1 {
				return fmt.Errorf("compiler-job: want one job directory")
			}
			return compilernode.RunJob(c.Context, c.Args().First(), os.Stdout)
		},
	}
}

// logger is the daemons' slog logger: text on the app's error writer, level
// from $KILN_LOG (debug, info, warn, error; info by default).
func logger(c *ucli.Context) *slog.Logger {
	level := slog.LevelInfo
	switch strings.ToLower(os.Getenv("KILN_LOG")) {
	case "debug":
		level = slog.LevelDebug
	case "warn":
		level = slog.LevelWarn
	case "error":
		level = slog.LevelError
	}
	return slog.New(slog.NewTextHandler(c.App.ErrWriter, &slog.HandlerOptions{Level: level}))
}

func rpcserverCommand() *ucli.Command {
	return &ucli.Command{
		Name:      "rpcserver",
		Usage:     "run a device daemon that serves this machine's devices to remote sessions",
		UsageText: "kiln rpcserver --key KEY [--tracker HOST:PORT] [--listen ADDR] [--token-file F] [--session-timeout D]",
		Description: `Serves this machine's devices (cpu, and cuda where a GPU is present) to remote
clients until SIGINT/SIGTERM. Where the CUDA driver finds a GPU, artifacts
built for cuda run on it: a function's kernels, or a graph module's VM with
its tensors in GPU memory, each module's device code loaded once; arrays move
between host and GPU here, the time evaluator times between CUDA events, and
a failed launch is reported naming the kernel and the CUDA error. On a board
of several GPUs each session gets one of its own (the one fewest sessions
use; its worker sees it alone, through CUDA_VISIBLE_DEVICES), so sandboxed
--max-sessions N serves N GPUs at once. Without a GPU, a cuda artifact is
refused, saying why. With --tracker it registers there under KEY with
its attributes (device names, memory, CUDA compute capability, CPU model and
features, target triple, kiln version), keeps a heartbeat and re-registers
after a tracker restart; clients then reach it through a lease.

Each session runs in a worker subprocess: a kernel that crashes kills the
worker, not the daemon, and the client is told which signal hit which
function. Uploaded files live in a per-session directory; names that would
leave it are refused. A session past its deadline is ended. One exclusive
session at a time unless --max-sessions says otherwise.

Workers are sandboxed with bubblewrap (bwrap) where it works: each in new
user, PID, mount, IPC and network namespaces, seeing only the system's
libraries, its own binary and its session directory (the one writable
place), so concurrent sessions cannot read, write, signal or outlive each
other, and --max-sessions above 1 is allowed. The daemon says at start (and
/metrics says, kiln_rpcserver_sandboxed) whether it sandboxes. As root, give
--worker-uids so that each session also runs as a uid of its own.

Examples:
   kiln rpcserver --tracker 127.0.0.1:9190 --key cpu-epyc
   kiln rpcserver --listen 0.0.0.0:9090 --advertise board7:9090 --tracker tracker:9190 --key rpi4`,
		Flags: append([]ucli.Flag{
			&ucli.StringFlag{Name: "key", Required: true, Usage: "device key clients ask the tracker for"},
			trackerFlag("HOST:PORT of the tracker to register with (none: serve direct sessions only)", false),
			&ucli.StringFlag{Name: "listen", Value: "127.0.0.1:9090", Usage: "address to listen on"},
			&ucli.StringFlag{Name: "proxy", Usage: "HOST:PORT of a kiln proxy to serve through (a daemon behind NAT): the daemon connects out to it, and clients reach it at the port the proxy opens, which is what it advertises; when the proxy goes away the daemon connects again (backoff to 10 s, for up to an hour) and asks for the same port; needs --token-file"},
			&ucli.StringFlag{Name: "advertise", Usage: "address clients should dial, as told to the tracker (default: the listen port on the address the tracker sees)"},
			&ucli.DurationFlag{Name: "session-timeout", Value: rpcserver.DefaultSessionTimeout, Usage: "longest a session may last (a lease may ask for less)"},
			&ucli.IntFlag{Name: "max-sessions", Value: 1, Usage: "sessions served at once (1: exclusive; more needs sandboxed sessions, or --insecure-shared)"},
			&ucli.BoolFlag{Name: "insecure-shared", Usage: "allow --max-sessions above 1 although sessions are not sandboxed from each other"},
			&ucli.StringFlag{Name: "sandbox", Value: rpcserver.SandboxAuto, Usage: "how workers are confined: auto (bubblewrap when it works here, else none, said at start), bwrap (bubblewrap or refuse to start), off"},
			&ucli.StringFlag{Name: "worker-uids", Usage: "uids sandboxed workers run as, one per session at a time, as FIRST-LAST or a comma list (the daemon must run as root; at least --max-sessions of them; default as root: uids from 1879048192 up)"},
			&ucli.StringFlag{Name: "max-session-memory", Usage: "memory cap of all of a session's processes together, e.g. 4GiB (a cgroup's limit: the daemon must be root or run in a cgroup delegated to its user, else it refuses the flag; default: none)"},
			&ucli.StringSliceFlag{Name: "plugin", Usage: "a shared object of kiln's packed ABI (exporting kiln_module_metadata) whose functions every session serves as globals; repeat for several"},
			&ucli.IntFlag{Name: "max-session-procs", Usage: "process cap of a session, all its processes counted (a cgroup's pids limit, else RLIMIT_NPROC of the session's own uid; refused with neither; default: 1024 when sandboxed with a cgroup or a worker uid, else none; -1: none)"},
			&ucli.StringFlag{Name: "dir", Usage: "directory for session files, and for the node id the tracker gave the daemon (file " + nodeIDFile + "), kept across restarts (default: a directory in the system's temporary directory, shared by the daemons that have none, which keeps no node id); one daemon per --dir"},
			&ucli.IntFlag{Name: "threads", Usage: "threads each session worker runs kernels' parallel loops on, the calling thread included (sets " + cpu.EnvThreads + "; default: the CPUs the worker may use, from its CPU affinity and cgroup quota)"},
			&ucli.StringSliceFlag{Name: "worker-env", Usage: "NAME=VALUE set in each session worker's environment (repeatable), e.g. CUDA_MODULE_LOADING=LAZY; of the daemon's own variables workers inherit only those the C runtime, kiln's thread pool, CUDA and Go need (PATH, HOME, the locale, LD_LIBRARY_PATH, CUDA_VISIBLE_DEVICES, " + cpu.EnvThreads + ", ...)"},
			&ucli.StringFlag{Name: "worker-wrapper", Usage: "command prefix for session workers, e.g. \"qemu-aarch64 -L /usr/aarch64-linux-gnu\" on an emulated board, \"taskset -c 2\" or \"nice\""},
			&ucli.StringFlag{Name: "emulated", Usage: "the emulator this daemon runs under (e.g. qemu-aarch64): registered as attribute emulated=true, and time evaluator results say their times are emulated; set by itself when --worker-wrapper starts with qemu-"},
			&ucli.Int64Flag{Name: "max-session-bytes", Usage: "most bytes of files one session may hold: its uploads, its loaded modules' copies and what its kernels write into its directory, which is a tmpfs of this size in memory (or a quarter of the memory when less) in the worker's own mount namespace, sandboxed or not (a sandboxed session's /tmp too); a daemon that cannot mount one refuses the flag (default: a quarter of the space free in --dir at start, then kernels' writes are uncapped where no tmpfs can be mounted, said at start; -1: no limit)"},
			&ucli.StringFlag{Name: "upload-cache-bytes", Value: "2GiB", Usage: "most bytes of uploaded files the daemon keeps by content, in a directory of its own in --dir, so that a later session of the same user that uploads the same file (a model's weights) has it linked in place instead of sent again; the least recently used go first; 0: keep none"},
			&ucli.StringFlag{Name: "metrics-listen", Usage: "HTTP address serving Prometheus /metrics"},
			&ucli.BoolFlag{Name: "allow-without-lease", Usage: "with --tracker, also accept sessions that carry no lease"},
			&ucli.BoolFlag{Name: "accept-fleet-token", Usage: "with --tracker and the fleet token in --token-file, also open sessions to hellos that carry the fleet token (by default they need a lease token)"},
			&ucli.StringFlag{Name: "tracker-token-file", Usage: "token for the tracker when it differs from --token-file (a join token: see --credential-file)"},
			credentialFlag(),
			&ucli.StringFlag{Name: "tls-ca", Usage: "PEM bundle of the CAs that sign the tracker's certificate (turns TLS on toward the tracker; --tls-cert/--tls-key, when given, are presented to it as this daemon's client certificate)"},
			&ucli.StringFlag{Name: "tls-server-name", Usage: "name to check in the tracker's certificate (default: the --tracker host)"},
			insecureFlag(),
		}, listenFlags()...),
		OnUsageError: usageError,
		Action:       runRPCServer,
	}
}

func runRPCServer(c *ucli.Context) error {
	if err := noArgs(c); err != nil {
		return err
	}
	tok, tlsCfg, err := serverAuth(c)
	if err != nil {
		return err
	}
	if client.IsJoinToken(tok) {
		return errors.New("rpcserver: --token-file holds a join token, which only a tracker accepts; give it with --tracker-token-file (and --credential-file) and keep a token of the daemon's own in --token-file")
	}
	log := logger(c)
	uids, err := parseUIDs(c.String("worker-uids"))
	if err != nil {
		return fmt.Errorf("--worker-uids: %w", err)
	}
	mem, err := parseByteSize(c.String("max-session-memory"))
	if err != nil {
		return fmt.Errorf("--max-session-memory: %w", err)
	}
	cacheBytes, err := parseByteSize(c.String("upload-cache-bytes"))
	if err != nil {
		return fmt.Errorf("--upload-cache-bytes: %w", err)
	}
	cfg := rpcserver.Config{
		Listen: c.String("listen"), Key: c.String("key"), Token: tok, TLS: tlsCfg,
		SessionTimeout: c.Duration("session-timeout"), MaxSessions: c.Int("max-sessions"),
		Dir: c.String("dir"), MetricsListen: c.String("metrics-listen"), Version: Version(), Logger: log,
		AllowWithoutLease: c.Bool("allow-without-lease"), Insecure: c.Bool("insecure"), InsecureShared: c.Bool("insecure-shared"),
		SessionQuota: c.Int64("max-session-bytes"), UploadCacheBytes: cacheBytes,
		Sandbox: c.String("sandbox"), WorkerUIDs: uids, MaxSessionMemory: mem, MaxSessionProcs: c.Int("max-session-procs"),
		Plugins: c.StringSlice("plugin"),
		Worker:  rpcserver.WorkerSpec{Wrapper: strings.Fields(c.String("worker-wrapper"))},
	}
	if addr := c.String("proxy"); addr != "" {
		if tok == "" {
			return errors.New("rpcserver --proxy: give --token-file: behind a proxy the daemon is reachable by anyone who reaches the proxy's port, and the proxy admits daemons by the same token")
		}
		pl, err := dialProxy(c.Context, addr, tok, cfg.Key, log)
		if err != nil {
			return err
		}
		cfg.Listener = pl
		log.Info("serving through kiln proxy", "proxy", addr, "public", pl.Addr().String())
	}
	if n := c.Int("threads"); n != 0 {
		if n < 1 {
			return fmt.Errorf("--threads %d: want a thread count of at least 1", n)
		}
		cfg.Worker.Env = append(cfg.Worker.Env, fmt.Sprintf("%s=%d", cpu.EnvThreads, n))
	}
	for _, kv := range c.StringSlice("worker-env") {
		if name, _, ok := strings.Cut(kv, "="); !ok || name == "" || strings.ContainsAny(name, " \t") {
			return fmt.Errorf("--worker-env %q: want NAME=VALUE", kv)
		}
		cfg.Worker.Env = append(cfg.Worker.Env, kv)
	}
	emulator := c.String("emulated")
	if w := cfg.Worker.Wrapper; emulator == "" && len(w) > 0 && strings.HasPrefix(filepath.Base(w[0]), "qemu-") {
		emulator = filepath.Base(w[0])
	}
	if emulator != "" {
		cfg.Worker.Env = append(cfg.Worker.Env, rpcserver.EnvEmulated+"="+emulator)
		log.Warn("running under an emulator: times measured here are not the board's", "emulator", emulator)
	}
	trTok := tok
	if f := c.String("tracker-token-file"); f != "" {
		b, err := os.ReadFile(f)
		if err != nil {
			return fmt.Errorf("--tracker-token-file: %w", err)
		}
		trTok = strings.TrimSpace(string(b))
	}
	// A daemon that registers with its own listener token holds the
	// fleet token there: it opens sessions to leases, not to that token.
	cfg.TokenIsFleet = c.String("tracker") != "" && tok != "" && trTok == tok
	cfg.AcceptFleetToken = c.Bool("accept-fleet-token")
	if c.String("tracker") != "" && !cfg.TokenIsFleet {
		warnFleetToken(log, "device daemon", trTok, c.String("credential-file"))
	}
	d, err := rpcserver.New(cfg)
	if err != nil {
		return err // it names the daemon already ("rpcserver: ...")
	}
	trackerAddr := c.String("tracker")
	if pl, ok := cfg.Listener.(*proxyListener); ok && trackerAddr == "" {
		trackerAddr = pl.tracker // the proxy's, as TVM's proxy registers its servers
	}
	if addr := trackerAddr; addr != "" {
		adv := c.String("advertise")
		if adv == "" && cfg.Listener != nil {
			adv = d.Addr().String() // the port the proxy opened
		}
		if adv == "" {
			_, port, err := net.SplitHostPort(d.Addr().String())
			if err != nil {
				return fmt.Errorf("rpcserver: listen address %q: %w", d.Addr(), err)
			}
			adv = ":" + port
		}
		trTLS, err := registrarTLS(c)
		if err != nil {
			return err
		}
		attrs := rpcserver.NodeAttrs(Version())
		attrs.Emulated = emulator
		maxSessions, sandboxed := d.Capacity()
		opts := client.TrackerOptions{Token: trTok, TLS: trTLS, Logger: log, CredentialFile: c.String("credential-file")}
		if dir := c.String("dir"); dir != "" {
			// A daemon of its own --dir keeps its node id there.
			opts.NodeIDFile = filepath.Join(dir, nodeIDFile)
		}
		reg := client.NewRegistrar(addr, opts, proto.RegisterArgs{
			Role: proto.NodeDevice, Key: cfg.Key, Addr: adv, Attrs: attrs, MaxSessions: maxSessions, Sandboxed: sandboxed,
		})
		reg.OnHealthCheck = deviceHealthCheck
		d.SetTracker(reg) // the daemon runs it and verifies leases with it
	}
	fmt.Fprintf(c.App.ErrWriter, "kiln rpcserver %q listening on %s\n", cfg.Key, d.Addr())
	return d.Run(c.Context)
}

// warnFleetToken warns when a node registers with the tracker on tok and
// tok is neither a join token nor replaced by a stored credential: then it
// is the fleet token, an all-role secret meant for bootstrap.
func warnFleetToken(log *slog.Logger, what, tok, credFile string) {
	if tok == "" || client.IsJoinToken(tok) {
		return
	}
	if credFile != "" {
		if _, err := os.Stat(credFile); err == nil {
			return
		}
	}
	log.Warn("this "+what+" registers with the fleet token, an all-role secret meant for bootstrap: give it a join token (kiln token create --role ...) and --credential-file instead", "node", what)
}

// nodeIDFile is the file in a device daemon's --dir that keeps its node id.
const nodeIDFile = "node-id"

// credentialFlag is where a node keeps the credential its join token was
// exchanged for.
func credentialFlag() ucli.Flag {
	return &ucli.StringFlag{Name: "credential-file", Usage: "file keeping this node's tracker credential (0600): with a join token (kiln token create --role ...), the node joins once and stores its credential here, then presents it instead of the token"}
}

// registrarTLS is the TLS config of a device daemon's connection to its
// tracker (nil: plain TCP). --tls-ca turns it on; the daemon's own
// certificate, when it has one, is its client certificate for a tracker
// that asks for mutual TLS.
func registrarTLS(c *ucli.Context) (*tls.Config, error) {
	if c.String("tls-ca") == "" {
		if c.String("tls-server-name") != "" {
			return nil, fmt.Errorf("--tls-server-name needs --tls-ca (the CAs that sign the tracker's certificate)")
		}
		return nil, nil
	}
	cfg, err := proto.TLSConfig{
		CertFile: c.String("tls-cert"), KeyFile: c.String("tls-key"), CAFile: c.String("tls-ca"),
		ServerName: c.String("tls-server-name"),
	}.Client()
	if err != nil {
		return nil, fmt.Errorf("tls toward the tracker: %w", err)
	}
	return cfg, nil
}

// deviceHealthCheck is a quarantined device's self-check: every device of
// every backend allocates, fills, reads back and frees a buffer.
func deviceHealthCheck(ctx context.Context) error {
	const n = 1 << 20
	want := make([]byte, n)
	for i := range want {
		want[i] = byte(i*7 + 3)
	}
	for _, api := range devices.Registered() {
		for id := range api.Count() {
			dev := devices.Device{Type: api.Type(), ID: int32(id)}
			p, err := api.Alloc(dev, n, 64, "")
			if err != nil {
				return fmt.Errorf("health check %s: alloc: %w", dev, err)
			}
			got := make([]byte, n)
			err = api.CopyFromHost(p, dev, want, 0)
			if err == nil {
				err = api.CopyToHost(got, p, dev, 0)
			}
			if err == nil {
				err = api.StreamSync(dev, 0)
			}
			api.Free(dev, p)
			if err != nil {
				return fmt.Errorf("health check %s: copy: %w", dev, err)
			}
			if !bytes.Equal(got, want) {
				return fmt.Errorf("health check %s: data read back differs from what was written", dev)
			}
		}
	}
	return nil
}

// rpcserverWorkerCommand is the hidden worker subprocess of a session.
func rpcserverWorkerCommand() *ucli.Command {
	return &ucli.Command{
		Name:   rpcserver.DefaultWorkerArgs[0],
		Hidden: true,
		Usage:  "serve one session (run by kiln rpcserver)",
		Action: func(c *ucli.Context) error {
			os.Exit(rpcserver.WorkerMain())
			return nil
		},
	}
}

// parseUIDs reads --worker-uids: "61000-61099", "61000,61001", or both.
func parseUIDs(v string) ([]int, error) {
	var out []int
	if strings.TrimSpace(v) == "" {
		return nil, nil
	}
	for _, part := range strings.Split(v, ",") {
		part = strings.TrimSpace(part)
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.Atoi(lo)
		if err != nil || a <= 0 {
			return nil, fmt.Errorf("%q is not a uid (a positive number) or a range FIRST-LAST", part)
		}
		b := a
		if isRange {
			if b, err = strconv.Atoi(hi); err != nil || b < a {
				return nil, fmt.Errorf("%q is not a range FIRST-LAST with FIRST <= LAST", part)
			}
		}
		if b-a >= 1<<16 {
			return nil, fmt.Errorf("%q gives more than 65536 uids", part)
		}
		for u := a; u <= b; u++ {
			out = append(out, u)
		}
	}
	return out, nil
}

// parseByteSize reads a size such as "512MiB", "4GiB", "2G" or "1048576";
// "" is 0.
func parseByteSize(v string) (int64, error) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, nil
	}
	num := strings.TrimRightFunc(v, func(r rune) bool { return r < '0' || r > '9' })
	unit := strings.TrimSpace(v[len(num):])
	mult := map[string]int64{"": 1, "B": 1, "K": 1 << 10, "KB": 1000, "KiB": 1 << 10, "M": 1 << 20, "MB": 1000_000, "MiB": 1 << 20,
		"G": 1 << 30, "GB": 1000_000_000, "GiB": 1 << 30, "T": 1 << 40, "TB": 1000_000_000_000, "TiB": 1 << 40}[unit]
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || mult == 0 || n < 0 || n > (1<<62)/mult {
		return 0, fmt.Errorf("%q is not a size such as 512MiB, 4GiB or a number of bytes", v)
	}
	return n * mult, nil
}
