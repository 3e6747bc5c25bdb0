// Package rpcserver owns the device daemon (kiln rpcserver): it accepts client
// sessions over the kiln wire protocol (package proto), serves each session
// in a worker subprocess of the same binary, and runs the session's remote
// functions there — files in a per-session directory, modules, functions,
// arrays, device attributes and the time evaluator (package
// rpcserver/timer).
//
// rpcserver imports the runtime (devices, devices/cpu, devices/cuda,
// ndarray, packedfunc, artifact) and proto; it must not import the compiler, the tracker, the
// client SDK or cli. The tracker is plugged in through the Tracker interface
// (client.Registrar implements it).
//
// # Process model
//
// The daemon process holds the listener, the sessions' directories and
// their deadlines; it never runs a kernel. A client's hello takes the
// device's session slot (one exclusive session by default: a second client
// is refused with ErrBusy and a message naming the holder). session.open
// verifies the client's lease with the tracker (when one is configured),
// creates the session directory and starts the worker: the daemon's own
// executable with Config.Worker.Args (DefaultWorkerArgs,
// "rpcserver-worker"), connected by two AF_UNIX socket pairs passed as file
// descriptors 3 and 4, a packet socket (5) that passes it clients' call
// connections, and the call board (6), a memfd page both map. The daemon
// serves the file methods itself.
//
// One hop per call: session.open answers with a call ticket; the client
// dials a second connection with proto.RoleCall and sends the ticket, and
// the daemon hands that TCP socket to the worker with SCM_RIGHTS. The
// worker answers it and serves the session's calls on it as plain frames
// (Server.ServeAdopted), so a call goes client → worker → client. Before
// each request it notes on the call board what it runs (the function's
// name), with plain stores and no system call; the daemon reads the board
// when the worker has died (to name the function that crashed, or the call
// that ran past its deadline) and when /metrics is scraped (calls in
// flight, calls served). TLS sessions get no ticket: their encryption
// state cannot leave the daemon's process, so the daemon forwards their
// calls to the worker as plain frames on fd 4 (proto.NewFrameClient /
// Server.ServeFrames). Array bulk transfers go through the daemon over fd
// 3 (a proto connection with role worker, yamux and bulk streams). The
// worker runs with GOMAXPROCS=1 unless WorkerSpec.Env sets it: its Go code
// is the call path only, and kernels' own threads (kiln's pool) are not Go
// threads.
//
// On a machine with a CUDA device (cuda.Available), a worker loads an
// artifact built for cuda on the first GPU it sees; where there are
// several, each session takes the one fewest open sessions use and its
// worker sees that one alone (CUDA_VISIBLE_DEVICES; gpus.go). It loads
// its device code once per load (the cubin for the GPU's architecture,
// else the PTX) and its host functions, which launch the kernels; a graph module's VM keeps its
// tensors in GPU memory. Clients allocate arrays on cuda:0 and copy numpy
// data in and out through array.copy_from/copy_to, which move it between
// host and GPU here. The time evaluator times functions whose arrays are
// on the GPU between CUDA events on the default stream. Without a CUDA
// device, such an artifact is refused, naming its target and why CUDA is
// absent.
//
// A kernel that crashes kills the worker, not the daemon: the daemon reads
// the worker's exit status (or, for a fatal signal the Go runtime caught,
// the "[signal SIGSEGV: …]" line of its stderr) and the call board, ends
// the session and frees the device at once. A client whose call connection
// broke asks session.status and gets ErrCrashed naming the signal and the
// function; calls through the daemon get it directly. A session past its
// deadline has its worker killed; its calls get ErrSessionExpired. A call
// or timing past its own deadline makes the worker kill itself (it marks
// the call on the board first); the session ends with ErrDeadline naming
// it. In each case the daemon closes the client's connection a little
// later (2 s), and a new session can start at once.
//
// # Sandboxed sessions
//
// Where bubblewrap works (Config.Sandbox, SandboxAuto by default; New
// probes it once), each worker runs under bwrap in new user, PID, mount,
// IPC, UTS and network namespaces, seeing read-only system directories,
// its binary, a private /tmp and its session directory, the only writable
// place (isolate.go, over internal/sandbox), with no capabilities,
// no_new_privs and /proc/sys read-only. Its descriptors pass through bwrap,
// so the handed-over call connection works without a network. Where the
// daemon runs as root, each session has a uid of its own, from
// Config.WorkerUIDs or else the automatic range (sandbox.AutoUIDs); setpriv
// drops to it before bwrap, so the sandbox's uid 0 is never the host's. Memory and process caps go through a
// cgroup of the session's own under the daemon's (v2 where delegated,
// else v1; a shell joins the cgroups and execs the rest, so every process
// of the session starts inside), or through prlimit's rlimits where no
// cgroup can be made. A sandboxed daemon may serve several sessions at
// once; an unsandboxed one needs InsecureShared for that. bubblewrap
// reports a worker killed by a signal as exit status 128+signal, which
// the daemon reads back as the signal.
//
// # Wiring the CLI
//
// The CLI's hidden subcommand named DefaultWorkerArgs[0] must do nothing
// but os.Exit(rpcserver.WorkerMain()). `kiln rpcserver` builds a Config
// from its flags (--listen, --key, --token-file, TLS flags through
// proto.TLSConfig.Server, --session-timeout, --metrics-listen, --sandbox,
// --worker-uids, --max-session-memory, --max-session-procs) and calls
// New and Run with a context cancelled on SIGINT/SIGTERM. With --tracker it
// builds a client.Registrar (its RegisterArgs.Attrs from NodeAttrs) and
// passes it as Config.Tracker; the daemon runs it.
//
// Tests re-exec their own binary: TestMain calls WorkerMain when an
// environment variable of its choosing is set, and Config.Worker points at
// os.Args[0] with that variable in Env.
package rpcserver
