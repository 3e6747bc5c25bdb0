package proto

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Tracker methods. A device daemon or compiler node dials the tracker with
// RoleDevice or RoleCompiler, registers, and keeps one connection open for
// its heartbeats; clients (the CLI, the Go SDK) dial with RoleClient.
// Durations travel as int64 nanoseconds and times as msgpack timestamps.
//
// Registration and health (device daemons and compiler nodes):
//
//	tracker.register    RegisterArgs   → RegisterReply
//	tracker.heartbeat   HeartbeatArgs  → HeartbeatReply
//	tracker.deregister  DeregisterArgs → nil
//	tracker.report      ReportArgs     → nil
//
// A heartbeat for a node the tracker does not know (it restarted and lost
// its registry, or marked the node lost and forgot it) fails with
// ErrNotFound: the node registers again with the same NodeID and carries on.
// A node whose connection drops dials again and registers again. A
// HeartbeatReply with HealthCheck set asks a quarantined device to run its
// self-check and send a ReportArgs of kind ReportHealth with the result; an
// OK result lifts the quarantine.
//
// Leases (clients; tracker.lease.verify is called by device daemons):
//
//	tracker.lease.request  LeaseRequestArgs → LeaseTicket
//	tracker.lease.wait     LeaseWaitArgs    → LeaseTicket
//	tracker.lease.cancel   LeaseWaitArgs    → nil
//	tracker.lease.renew    LeaseRenewArgs   → Lease
//	tracker.lease.release  LeaseRenewArgs   → nil
//	tracker.lease.verify   LeaseVerifyArgs  → LeaseInfo
//
// tracker.lease.request queues the request and waits up to its Wait for a
// device; it answers a LeaseTicket that holds the Lease when one was granted,
// else the ticket id and the request's queue position. The client then calls
// tracker.lease.wait with the ticket until it gets a Lease; each answer
// carries the current position (the SDK passes it to a callback). At the
// request's Deadline the tracker drops it and answers an error wrapping
// ErrDeadline that names the key and says whether any device serves it. A
// ticket belongs to the connection that made it: it is dropped (and a lease
// granted to it but not yet delivered is released) when that connection ends.
// A Lease expires at Expires unless renewed; a daemon asked to open a session
// with a lease token checks it with tracker.lease.verify, which fails with
// ErrNotFound for an unknown token, ErrSessionExpired for an expired one, and
// ErrBadRequest for a token issued for another node.
//
// Queries:
//
//	tracker.query  QueryArgs → TrackerSummary
//
// Build jobs (clients submit; compiler nodes take and complete):
//
//	tracker.build.submit    BuildSubmitArgs   → BuildJob
//	tracker.build.status    BuildJobArgs      → BuildJob
//	tracker.build.wait      BuildWaitArgs     → BuildJob
//	tracker.build.cancel    BuildJobArgs      → BuildJob
//	tracker.build.take      BuildTakeArgs     → BuildTakeReply
//	tracker.build.progress  BuildProgressArgs → nil
//	tracker.build.complete  BuildCompleteArgs → nil
//	tracker.build.fail      BuildFailArgs     → nil
//
// tracker.build.wait long-polls: it answers as soon as the job's Seq is
// greater than the caller's Seq (any change: state, progress) or its Wait
// passes. tracker.build.take long-polls likewise and answers a nil Job when
// nothing matched within Wait. A progress, complete or fail call for a job
// that is no longer the caller's (cancelled, timed out, requeued) fails with
// ErrCancelled: the compiler node stops working on it.
//
// Artifacts move on bulk streams, named by the lowercase hex sha256 of their
// bytes:
//
//	tracker.artifact.upload    bulk, name = sha256, Size bytes up, nothing back
//	tracker.artifact.download  bulk, name = sha256, nothing up, the bytes back
//
// The tracker checks an upload's hash and refuses a mismatch (ErrBadRequest).
// A compiler node uploads the artifact, then calls tracker.build.complete
// with its sha256.
//
// A module larger than MaxInlineModule is not sent in tracker.build.submit
// (whose frame the tracker would hold whole) but on a bulk stream, and a
// compiler node reads such a job's module back on one:
//
//	tracker.build.submit.stream  bulk, up: a frame of BuildSubmitArgs (its
//	                             Module empty, at most MaxSubmitArgs bytes)
//	                             then the module's bytes; back: a frame of
//	                             the BuildJob queued
//	tracker.build.module         bulk, name = job id, nothing up, the
//	                             module's bytes back (to the compiler node
//	                             running the job)
//
// The tracker charges the module's size, from the stream's header, against
// the build queue's byte caps before it takes the first byte, writes the
// bytes to its module store as they arrive, hashing them, and reports the
// digest as the job's ModuleSHA256; a refused or broken stream leaves
// nothing behind.
const (
	MethodTrackerRegister   = "tracker.register"
	MethodTrackerHeartbeat  = "tracker.heartbeat"
	MethodTrackerDeregister = "tracker.deregister"
	MethodTrackerReport     = "tracker.report"
	MethodTrackerJoin       = "tracker.join"

	MethodLeaseRequest = "tracker.lease.request"
	MethodLeaseWait    = "tracker.lease.wait"
	MethodLeaseCancel  = "tracker.lease.cancel"
	MethodLeaseRenew   = "tracker.lease.renew"
	MethodLeaseRelease = "tracker.lease.release"
	MethodLeaseVerify  = "tracker.lease.verify"

	MethodTrackerQuery = "tracker.query"

	MethodBuildSubmit   = "tracker.build.submit"
	MethodBuildStatus   = "tracker.build.status"
	MethodBuildWait     = "tracker.build.wait"
	MethodBuildCancel   = "tracker.build.cancel"
	MethodBuildTake     = "tracker.build.take"
	MethodBuildProgress = "tracker.build.progress"
	MethodBuildComplete = "tracker.build.complete"
	MethodBuildFail     = "tracker.build.fail"

	BulkArtifactUpload   = "tracker.artifact.upload"
	BulkArtifactDownload = "tracker.artifact.download"
	BulkBuildSubmit      = "tracker.build.submit.stream"
	BulkBuildModule      = "tracker.build.module"
)

// MaxInlineModule is the largest module tracker.build.submit carries in
// its frame, and tracker.build.take hands out in its reply: a larger one
// moves on a bulk stream (BulkBuildSubmit, BulkBuildModule).
const MaxInlineModule = 1 << 20

// MaxSubmitArgs bounds the frame of BuildSubmitArgs at the head of a
// BulkBuildSubmit stream.
const MaxSubmitArgs = 64 << 10

// NodeRole says what a registered node is.
type NodeRole string

// The node roles.
const (
	NodeDevice   NodeRole = "device"
	NodeCompiler NodeRole = "compiler"
)

// NodeAttrs describes a node. Selectors see it flattened (Flatten): every
// field below has the selector name given in its comment.
type NodeAttrs struct {
	// DeviceTypes lists the device kinds served ("cpu", "cuda"): selector
	// "device.<type>" is "true" for each.
	DeviceTypes []string `msgpack:"device_types,omitempty" json:"device_types,omitempty"`
	// DeviceNames are the devices' product names: "device.name" (joined by ", ").
	DeviceNames []string `msgpack:"device_names,omitempty" json:"device_names,omitempty"`
	// MemoryBytes is the device memory (host memory for CPU-only nodes): "memory" and "memory.gib".
	MemoryBytes int64 `msgpack:"memory_bytes,omitempty" json:"memory_bytes,omitempty"`
	// CUDACompute is the CUDA compute capability, "8.0": "cuda.compute".
	CUDACompute string `msgpack:"cuda_compute,omitempty" json:"cuda_compute,omitempty"`
	// CPUModel is the CPU's model name: "cpu.model".
	CPUModel string `msgpack:"cpu_model,omitempty" json:"cpu_model,omitempty"`
	// CPUFeatures lists CPU flags ("avx2", "avx512f"): "cpu.<flag>" is "true" for
	// each; "cpu.avx512" is "true" when any avx512 flag is present.
	CPUFeatures []string `msgpack:"cpu_features,omitempty" json:"cpu_features,omitempty"`
	// CPUCores is the number of logical CPUs: "cpu.cores".
	CPUCores int `msgpack:"cpu_cores,omitempty" json:"cpu_cores,omitempty"`
	// Triple is the target triple, "x86_64-linux-gnu": "target".
	Triple string `msgpack:"triple,omitempty" json:"triple,omitempty"`
	// KilnVersion is the node's kiln version: "kiln.version".
	KilnVersion string `msgpack:"kiln_version,omitempty" json:"kiln_version,omitempty"`
	// Targets lists what a compiler node builds ("cpu", "cuda", "c -mtriple=…"):
	// "target.<kind>" is "true" for each kind (the first word).
	Targets []string `msgpack:"targets,omitempty" json:"targets,omitempty"`
	// Compiler is a compiler node's C compiler identity: "compiler".
	Compiler string `msgpack:"compiler,omitempty" json:"compiler,omitempty"`
	// CrossCompilers lists cross compilers found: "cross.<triple>" is "true".
	CrossCompilers []string `msgpack:"cross_compilers,omitempty" json:"cross_compilers,omitempty"`
	// NVRTC and NVCC say whether CUDA compilation is available: "nvrtc", "nvcc".
	NVRTC bool `msgpack:"nvrtc,omitempty" json:"nvrtc,omitempty"`
	NVCC  bool `msgpack:"nvcc,omitempty" json:"nvcc,omitempty"`
	// Emulated names the emulator a device daemon runs under
	// ("qemu-aarch64"): "emulated" is "true" and "emulator" the name.
	Emulated string `msgpack:"emulated,omitempty" json:"emulated,omitempty"`
	// Extra holds free-form attributes, seen by selectors under their own names.
	Extra map[string]string `msgpack:"extra,omitempty" json:"extra,omitempty"`
}

// Flatten returns the attributes as the selector names listed on NodeAttrs.
// Booleans are "true"; absent attributes are absent.
// TripleArch names a target triple's architecture as Go does ("arm64" for
// aarch64-linux-gnu, "amd64" for x86_64-linux-gnu, "riscv64"): the
// selector key "arch", as in `--selector "arch=arm64,cores>=4"`.
func TripleArch(triple string) string {
	arch, _, _ := strings.Cut(triple, "-")
	switch arch {
	case "aarch64", "arm64":
		return "arm64"
	case "x86_64", "amd64":
		return "amd64"
	case "i386", "i486", "i586", "i686":
		return "386"
	case "armv7l", "armv7", "arm", "armhf":
		return "arm"
	case "powerpc64le", "ppc64le":
		return "ppc64le"
	}
	return arch
}

func (a NodeAttrs) Flatten() map[string]string {
	m := make(map[string]string)
	for _, t := range a.DeviceTypes {
		m["device."+strings.ToLower(t)] = "true"
	}
	if len(a.DeviceNames) > 0 {
		m["device.name"] = strings.Join(a.DeviceNames, ", ")
	}
	if a.MemoryBytes > 0 {
		m["memory"] = strconv.FormatInt(a.MemoryBytes, 10)
		m["memory.gib"] = strconv.FormatFloat(float64(a.MemoryBytes)/(1<<30), 'f', -1, 64)
	}
	if a.CUDACompute != "" {
		m["cuda.compute"] = a.CUDACompute
	}
	if a.CPUModel != "" {
		m["cpu.model"] = a.CPUModel
	}
	for _, f := range a.CPUFeatures {
		f = strings.ToLower(f)
		m["cpu."+f] = "true"
		if strings.HasPrefix(f, "avx512") {
			m["cpu.avx512"] = "true"
		}
	}
	if a.CPUCores > 0 {
		m["cpu.cores"] = strconv.Itoa(a.CPUCores)
		m["cores"] = m["cpu.cores"]
	}
	if a.Triple != "" {
		m["target"] = a.Triple
		m["arch"] = TripleArch(a.Triple)
	}
	if a.KilnVersion != "" {
		m["kiln.version"] = a.KilnVersion
	}
	for _, t := range a.Targets {
		m["target."+TargetKind(t)] = "true"
	}
	if a.Compiler != "" {
		m["compiler"] = a.Compiler
	}
	for _, c := range a.CrossCompilers {
		m["cross."+c] = "true"
	}
	if a.NVRTC {
		m["nvrtc"] = "true"
	}
	if a.NVCC {
		m["nvcc"] = "true"
	}
	if a.Emulated != "" {
		m["emulated"] = "true"
		m["emulator"] = a.Emulated
	}
	for k, v := range a.Extra {
		m[k] = v
	}
	return m
}

// TargetKind returns a target string's kind: its first word ("cuda" for
// "cuda -arch=sm_80"). Compiler nodes take the jobs whose target kind is
// one of their Targets' kinds.
func TargetKind(target string) string {
	f := strings.Fields(target)
	if len(f) == 0 {
		return ""
	}
	return f[0]
}

// JoinArgs exchanges a join token (the hello's token, on a device or
// compiler connection) for a per-node credential. A connection admitted
// with a join token may call tracker.join and nothing else.
type JoinArgs struct {
	// NodeID is not honoured: the tracker assigns every joining node a
	// fresh id, so a join token can never claim an existing node's id
	// (kept so that older nodes' requests still decode).
	NodeID string `msgpack:"node_id,omitempty"`
}

// JoinReply answers tracker.join: the node's id and its credential, the
// token it presents in every later hello. The credential admits only the
// role of the join token and only registrations under NodeID.
type JoinReply struct {
	NodeID     string `msgpack:"node_id"`
	Role       Role   `msgpack:"role"`
	Credential string `msgpack:"credential"`
}

// RegisterArgs registers a device daemon or compiler node.
type RegisterArgs struct {
	// NodeID names the node; it stays the same across the node's
	// re-registrations (after a dropped connection or a tracker restart).
	// Empty asks the tracker to choose one, returned in RegisterReply.
	NodeID string `msgpack:"node_id"`
	// Role is device or compiler; it must agree with the hello's role.
	Role NodeRole `msgpack:"role"`
	// Key is the device key clients ask for ("rtx4090", "rpi4"); compiler
	// nodes may leave it empty.
	Key string `msgpack:"key"`
	// Addr is where clients reach the daemon (host:port). A host left empty
	// ("":9091) is filled with the address the tracker sees the node at.
	Addr string `msgpack:"addr"`
	// Attrs describes the node.
	Attrs NodeAttrs `msgpack:"attrs"`
	// ActiveLease is the lease id of a session the daemon is serving when it
	// (re-)registers, empty when idle.
	ActiveLease string `msgpack:"active_lease,omitempty"`
	// ActiveLeases lists every lease the daemon serves a session under
	// when it serves several (ActiveLease names the first).
	ActiveLeases []string `msgpack:"active_leases,omitempty"`
	// MaxSessions is how many sessions the device daemon serves at once;
	// Sandboxed says whether they are sandboxed from each other. The
	// tracker grants up to MaxSessions concurrent leases on a sandboxed
	// device, one on any other.
	MaxSessions int  `msgpack:"max_sessions,omitempty"`
	Sandboxed   bool `msgpack:"sandboxed,omitempty"`
}

// RegisterReply answers tracker.register.
type RegisterReply struct {
	// NodeID is the node's id (the one asked for, or a new one).
	NodeID string `msgpack:"node_id"`
	// HeartbeatInterval is how often the node must send tracker.heartbeat;
	// a node silent for LostAfter is marked lost.
	HeartbeatInterval time.Duration `msgpack:"heartbeat_interval"`
	// LostAfter is how long the tracker waits before it marks a silent node lost.
	LostAfter time.Duration `msgpack:"lost_after"`
	// Addr is the address the tracker will hand to clients.
	Addr string `msgpack:"addr"`
}

// HeartbeatArgs keeps a node alive.
type HeartbeatArgs struct {
	NodeID string `msgpack:"node_id"`
	// ActiveLease is the lease the daemon is serving now, empty when idle.
	ActiveLease string `msgpack:"active_lease,omitempty"`
	// ActiveLeases lists every lease the daemon serves a session under
	// when it serves several (ActiveLease names the first).
	ActiveLeases []string `msgpack:"active_leases,omitempty"`
	// UnleasedSessions counts the sessions the daemon serves under no
	// lease (its own token's, with --allow-without-lease): the tracker
	// counts them against the device's capacity as it counts leases.
	UnleasedSessions int `msgpack:"unleased_sessions,omitempty"`
	// Load is free-form load information shown by query (running jobs, sessions).
	Load string `msgpack:"load,omitempty"`
}

// HeartbeatReply answers tracker.heartbeat.
type HeartbeatReply struct {
	// State is the node's state as the tracker sees it.
	State NodeState `msgpack:"state"`
	// HeartbeatInterval may change between heartbeats.
	HeartbeatInterval time.Duration `msgpack:"heartbeat_interval"`
	// HealthCheck asks a quarantined device to run its self-check and
	// report the result (ReportArgs, Kind ReportHealth).
	HealthCheck bool `msgpack:"health_check,omitempty"`
	// LeaseEnded says that the lease the heartbeat named as active is no
	// longer held (released or expired): the daemon ends its session.
	LeaseEnded bool `msgpack:"lease_ended,omitempty"`
	// EndedLeases lists the leases the heartbeat named as active that are
	// no longer held: the daemon ends their sessions.
	EndedLeases []string `msgpack:"ended_leases,omitempty"`
}

// DeregisterArgs removes a node (a daemon that shuts down cleanly).
type DeregisterArgs struct {
	NodeID string `msgpack:"node_id"`
}

// ReportKind says what a ReportArgs reports.
type ReportKind string

// The report kinds.
const (
	// ReportFailure: a device failed (a crashed worker, a kernel error
	// that points at the device, a session that could not be opened). Sent
	// by the daemon or by a client holding a lease on it. QuarantineAfter
	// failures within the tracker's failure window quarantine the device.
	ReportFailure ReportKind = "failure"
	// ReportHealth: the result of a device's self-check (OK says whether it
	// passed). A pass lifts a quarantine and clears the failure count.
	ReportHealth ReportKind = "health"
)

// ReportArgs reports a device failure or a health check result. A client
// names the device by LeaseID (with its Token), a daemon by NodeID.
type ReportArgs struct {
	NodeID  string     `msgpack:"node_id,omitempty"`
	LeaseID string     `msgpack:"lease_id,omitempty"`
	Token   string     `msgpack:"token,omitempty"`
	Kind    ReportKind `msgpack:"kind"`
	OK      bool       `msgpack:"ok,omitempty"`
	Message string     `msgpack:"message,omitempty"`
}

// NodeState is a node's state in the registry.
type NodeState string

// The node states.
const (
	StateFree        NodeState = "free"        // registered, heartbeating, not leased
	StateBusy        NodeState = "busy"        // a lease is out on it (a compiler running a job)
	StateLost        NodeState = "lost"        // silent for longer than LostAfter
	StateQuarantined NodeState = "quarantined" // failed repeatedly; waits for a health check
)

// LeaseRequestArgs asks for a device.
type LeaseRequestArgs struct {
	// Key asks for a device registered under this key; empty means any key.
	Key string `msgpack:"key,omitempty"`
	// Selector filters devices by attributes: comma-separated terms
	// "name OP value", OP one of = != > >= < <=, compared as numbers when
	// both sides parse as numbers, else as strings (only = and != then);
	// "cuda.compute>=8.0,cpu.avx512=true". A bare name means "name=true".
	Selector string `msgpack:"selector,omitempty"`
	// Priority orders requests: higher first, FIFO within a priority.
	Priority int `msgpack:"priority,omitempty"`
	// Deadline is when the request gives up (zero: the call's own deadline,
	// else it waits until cancelled).
	Deadline time.Time `msgpack:"deadline,omitempty"`
	// SessionTimeout is how long the session on the device may last; the
	// daemon reads it from tracker.lease.verify (0: the daemon's default).
	SessionTimeout time.Duration `msgpack:"session_timeout,omitempty"`
	// TTL is how long the lease lasts without renewal (0: the tracker's default).
	TTL time.Duration `msgpack:"ttl,omitempty"`
	// Wait bounds how long this call waits before answering with the
	// queue position (0: the tracker's default, about a second).
	Wait time.Duration `msgpack:"wait,omitempty"`
	// User names the requester in query output.
	User string `msgpack:"user,omitempty"`
	// RequestKey, when set, makes the request idempotent: while a lease
	// granted to a request of the same user with this key is held, the
	// request answers that lease at once instead of queueing. A client
	// whose tracker stopped between granting a lease and delivering it
	// asks again with the key and gets the lease it was granted. The SDK
	// sets a random key per RequestLease.
	RequestKey string `msgpack:"request_key,omitempty"`
	// Arch is the architecture the artifact to run is built for, as the
	// selector key "arch" names it ("arm64"): only devices of that
	// architecture (or of none registered) are granted, and when every
	// device the key and selector match is of another one the request is
	// refused at once with ErrBadRequest, naming both.
	Arch string `msgpack:"arch,omitempty"`
	// FailUnserved refuses the request at once with ErrNotFound when no
	// registered device (free, busy, quarantined or lost) matches the key
	// and selector, instead of waiting for one to register.
	FailUnserved bool `msgpack:"fail_unserved,omitempty"`
}

// LeaseWaitArgs names a queued request (tracker.lease.wait, tracker.lease.cancel).
type LeaseWaitArgs struct {
	Ticket string        `msgpack:"ticket"`
	Wait   time.Duration `msgpack:"wait,omitempty"`
}

// LeaseTicket answers tracker.lease.request and tracker.lease.wait: Lease is
// set once granted, else Position is the request's place in its queue
// (1 = next) and Served says whether any live device could ever match it.
type LeaseTicket struct {
	Ticket   string `msgpack:"ticket"`
	Position int    `msgpack:"position"`
	Queue    string `msgpack:"queue"`
	Served   bool   `msgpack:"served"`
	Lease    *Lease `msgpack:"lease,omitempty"`
}

// Lease is a client's exclusive right to a device until Expires.
type Lease struct {
	ID string `msgpack:"id"`
	// Token is presented to the daemon when opening a session; the daemon
	// checks it with tracker.lease.verify.
	Token  string `msgpack:"token"`
	NodeID string `msgpack:"node_id"`
	Key    string `msgpack:"key"`
	// Addr is the device daemon's address.
	Addr           string        `msgpack:"addr"`
	Expires        time.Time     `msgpack:"expires"`
	TTL            time.Duration `msgpack:"ttl"`
	SessionTimeout time.Duration `msgpack:"session_timeout,omitempty"`
	Attrs          NodeAttrs     `msgpack:"attrs"`
}

// LeaseRenewArgs names a lease by id and token (renew, release).
type LeaseRenewArgs struct {
	ID    string `msgpack:"id"`
	Token string `msgpack:"token"`
}

// LeaseVerifyArgs is a daemon's question: is this token a live lease on me?
type LeaseVerifyArgs struct {
	NodeID string `msgpack:"node_id"`
	Token  string `msgpack:"token"`
}

// LeaseInfo answers tracker.lease.verify.
type LeaseInfo struct {
	ID             string        `msgpack:"id"`
	Key            string        `msgpack:"key"`
	User           string        `msgpack:"user,omitempty"`
	Expires        time.Time     `msgpack:"expires"`
	SessionTimeout time.Duration `msgpack:"session_timeout,omitempty"`
}

// QueryArgs asks for the tracker's summary.
type QueryArgs struct {
	// Jobs bounds the recent jobs listed (0: the tracker's default, 20; at
	// most MaxQueryJobs).
	Jobs int `msgpack:"jobs,omitempty"`
	// JobsBefore, when set, lists the jobs submitted before this job id
	// (the previous page's TrackerSummary.MoreJobsBefore).
	JobsBefore string `msgpack:"jobs_before,omitempty"`
}

// MaxQueryJobs is the most jobs one query lists; page on with JobsBefore.
const MaxQueryJobs = 1000

// TrackerSummary answers tracker.query.
type TrackerSummary struct {
	Now      time.Time      `msgpack:"now" json:"now"`
	Keys     []KeySummary   `msgpack:"keys" json:"keys"`
	Devices  []NodeSummary  `msgpack:"devices" json:"devices"`
	Compiler []NodeSummary  `msgpack:"compilers" json:"compilers"`
	Queues   []QueueSummary `msgpack:"queues" json:"queues"`
	Jobs     []BuildJob     `msgpack:"jobs" json:"jobs"`
	// MoreJobsBefore, when older jobs than those listed remain, is the
	// QueryArgs.JobsBefore of the next page.
	MoreJobsBefore string `msgpack:"more_jobs_before,omitempty" json:"more_jobs_before,omitempty"`
	// JobCounts counts all jobs by state.
	JobCounts map[JobState]int `msgpack:"job_counts" json:"job_counts"`
	// BuildQueue lists the queued jobs in the order they are handed to
	// compiler nodes (at most MaxQueryJobs), with their Position and ETA.
	BuildQueue []BuildJob `msgpack:"build_queue,omitempty" json:"build_queue,omitempty"`
	// TVMServers lists servers registered through the TVM tracker protocol.
	TVMServers []TVMServerSummary `msgpack:"tvm_servers,omitempty" json:"tvm_servers,omitempty"`
	Leases     int                `msgpack:"leases" json:"leases"`
}

// KeySummary counts a key's devices by state and its waiting requests.
type KeySummary struct {
	Key         string `msgpack:"key" json:"key"`
	Free        int    `msgpack:"free" json:"free"`
	Busy        int    `msgpack:"busy" json:"busy"`
	Lost        int    `msgpack:"lost" json:"lost"`
	Quarantined int    `msgpack:"quarantined" json:"quarantined"`
	Pending     int    `msgpack:"pending" json:"pending"`
}

// NodeSummary is one registered node.
type NodeSummary struct {
	NodeID     string    `msgpack:"node_id" json:"node_id"`
	Role       NodeRole  `msgpack:"role" json:"role"`
	Key        string    `msgpack:"key,omitempty" json:"key,omitempty"`
	Addr       string    `msgpack:"addr" json:"addr"`
	State      NodeState `msgpack:"state" json:"state"`
	LastSeen   time.Time `msgpack:"last_seen" json:"last_seen"`
	Failures   int       `msgpack:"failures,omitempty" json:"failures,omitempty"`
	LastError  string    `msgpack:"last_error,omitempty" json:"last_error,omitempty"`
	Lease      string    `msgpack:"lease,omitempty" json:"lease,omitempty"`
	Job        string    `msgpack:"job,omitempty" json:"job,omitempty"`
	Load       string    `msgpack:"load,omitempty" json:"load,omitempty"`
	Attrs      NodeAttrs `msgpack:"attrs" json:"attrs"`
	Registered time.Time `msgpack:"registered" json:"registered"`
}

// QueueSummary is one request queue (a key, or a selector across keys).
type QueueSummary struct {
	Queue   string          `msgpack:"queue" json:"queue"`
	Waiting []WaitingTicket `msgpack:"waiting" json:"waiting"`
}

// WaitingTicket is one queued lease request, in queue order.
type WaitingTicket struct {
	Ticket   string    `msgpack:"ticket" json:"ticket"`
	Position int       `msgpack:"position" json:"position"`
	Priority int       `msgpack:"priority" json:"priority"`
	User     string    `msgpack:"user,omitempty" json:"user,omitempty"`
	Selector string    `msgpack:"selector,omitempty" json:"selector,omitempty"`
	Since    time.Time `msgpack:"since" json:"since"`
	Deadline time.Time `msgpack:"deadline,omitempty" json:"deadline,omitempty"`
}

// TVMServerSummary is an RPC server registered with the TVM tracker protocol.
type TVMServerSummary struct {
	Key     string `msgpack:"key" json:"key"`
	Addr    string `msgpack:"addr" json:"addr"`
	Free    int    `msgpack:"free" json:"free"`
	Pending int    `msgpack:"pending" json:"pending"`
}

// JobState is a build job's state.
type JobState string

// The job states. Succeeded, failed and cancelled are final.
const (
	JobQueued    JobState = "queued"
	JobRunning   JobState = "running"
	JobSucceeded JobState = "succeeded"
	JobFailed    JobState = "failed"
	JobCancelled JobState = "cancelled"
)

// Final reports whether s is a final state.
func (s JobState) Final() bool {
	return s == JobSucceeded || s == JobFailed || s == JobCancelled
}

// JobClass sorts the build queue: interactive jobs (someone waits for
// them: kiln build --tracker, the C API) are handed to compiler nodes
// before bulk ones (tuning candidates); within a class, higher Priority
// first, then the oldest.
type JobClass string

// The job classes. A job submitted without one is interactive.
const (
	JobInteractive JobClass = "interactive"
	JobBulk        JobClass = "bulk"
)

// Rank orders the classes: lower is handed out first (an unknown class
// after every known one).
func (c JobClass) Rank() int {
	switch c {
	case "", JobInteractive:
		return 0
	case JobBulk:
		return 1
	}
	return 2
}

// StoredFormat reports whether a build job's module of format f is the
// sha256 of bytes in the tracker's artifact store ("onnx-artifact",
// "tvmscript-artifact") rather than the module itself.
func StoredFormat(f string) bool { return f == "onnx-artifact" || f == "tvmscript-artifact" }

// BuildSubmitArgs submits a build job.
type BuildSubmitArgs struct {
	// Name labels the job in query output (a file name).
	Name string `msgpack:"name,omitempty"`
	// Module is the IRModule in TVMScript text form.
	Module string `msgpack:"module"`
	// Format says what Module holds: "tvmscript" (default),
	// "onnx-base64" (an ONNX model, base64), "onnx-artifact" (the sha256
	// of an ONNX model uploaded to the artifact store, for models too big
	// for one frame) or "tvmscript-artifact" (the sha256 of a TVMScript
	// module in the artifact store; with the build option
	// tuning-db=bundled, of the module and a tuning database in one zip).
	// The artifact formats are those StoredFormat reports.
	Format string `msgpack:"format,omitempty"`
	// Target is the target string ("cpu", "cuda -arch=sm_80").
	Target string `msgpack:"target"`
	// Options are compiler options passed through to the compiler node.
	Options map[string]string `msgpack:"options,omitempty"`
	// QueueTimeout bounds the time queued (0: the tracker's default).
	QueueTimeout time.Duration `msgpack:"queue_timeout,omitempty"`
	// RunTimeout bounds the time running on a compiler node (0: the tracker's default).
	RunTimeout time.Duration `msgpack:"run_timeout,omitempty"`
	// SubmitKey, when set, makes the submission idempotent: a submission
	// by the same user with the key of a job the tracker holds answers
	// that job instead of queueing another, so a client that lost its
	// connection during a submit sends it again safely. The SDK sets a
	// random key per SubmitBuild.
	SubmitKey string `msgpack:"submit_key,omitempty"`
	// Class and Priority place the job in the queue (see JobClass;
	// higher priority first).
	Class    JobClass `msgpack:"class,omitempty"`
	Priority int      `msgpack:"priority,omitempty"`
	// CancelOnDisconnect cancels the job while it is still queued once
	// no connection has submitted it or waited for it for the tracker's
	// grace period (--job-orphan-grace): a client that was killed leaves
	// no work behind, one that reconnects and waits again keeps its job.
	CancelOnDisconnect bool `msgpack:"cancel_on_disconnect,omitempty"`
}

// BuildJob is a build job as the tracker reports it. Module is only filled
// in by tracker.build.take, and only for a module of at most
// MaxInlineModule bytes: a compiler node reads a larger one (ModuleSize
// bytes hashing to ModuleSHA256) from BulkBuildModule.
type BuildJob struct {
	ID           string            `msgpack:"id" json:"id"`
	Name         string            `msgpack:"name,omitempty" json:"name,omitempty"`
	Target       string            `msgpack:"target" json:"target"`
	Format       string            `msgpack:"format,omitempty" json:"format,omitempty"`
	Options      map[string]string `msgpack:"options,omitempty" json:"options,omitempty"`
	Module       string            `msgpack:"module,omitempty" json:"-"`
	ModuleSize   int64             `msgpack:"module_size,omitempty" json:"module_size,omitempty"`
	ModuleSHA256 string            `msgpack:"module_sha256,omitempty" json:"module_sha256,omitempty"`
	State        JobState          `msgpack:"state" json:"state"`
	Seq          uint64            `msgpack:"seq" json:"seq"`
	Attempt      int               `msgpack:"attempt" json:"attempt"`
	Node         string            `msgpack:"node,omitempty" json:"node,omitempty"`
	Submitted    time.Time         `msgpack:"submitted" json:"submitted"`
	Started      time.Time         `msgpack:"started,omitempty" json:"started,omitempty"`
	Finished     time.Time         `msgpack:"finished,omitempty" json:"finished,omitempty"`
	QueueTimeout time.Duration     `msgpack:"queue_timeout" json:"queue_timeout"`
	RunTimeout   time.Duration     `msgpack:"run_timeout" json:"run_timeout"`
	Progress     float64           `msgpack:"progress,omitempty" json:"progress,omitempty"`
	Message      string            `msgpack:"message,omitempty" json:"message,omitempty"`
	Error        string            `msgpack:"error,omitempty" json:"error,omitempty"`
	Artifact     string            `msgpack:"artifact,omitempty" json:"artifact,omitempty"`
	ArtifactSize int64             `msgpack:"artifact_size,omitempty" json:"artifact_size,omitempty"`
	Log          string            `msgpack:"log,omitempty" json:"log,omitempty"`
	// Owner is the user whose named token submitted the job ("" for the
	// fleet token). Other users see the job without its options, message,
	// error and log.
	Owner string `msgpack:"owner,omitempty" json:"owner,omitempty"`
	// SubmitKey is the submission's BuildSubmitArgs.SubmitKey, shown to
	// its owner only.
	SubmitKey string `msgpack:"submit_key,omitempty" json:"-"`
	// Class, Priority and CancelOnDisconnect are the submission's.
	Class              JobClass `msgpack:"class,omitempty" json:"class,omitempty"`
	Priority           int      `msgpack:"priority,omitempty" json:"priority,omitempty"`
	CancelOnDisconnect bool     `msgpack:"cancel_on_disconnect,omitempty" json:"cancel_on_disconnect,omitempty"`
	// Position (1 = next) and ETA (how long until it is likely built,
	// from the recent jobs' build times and the compiler nodes that
	// build its target) are set on a queued job when it is reported;
	// they are not stored.
	Position int           `msgpack:"position,omitempty" json:"position,omitempty"`
	ETA      time.Duration `msgpack:"eta,omitempty" json:"eta,omitempty"`
}

// BuildJobArgs names a job.
type BuildJobArgs struct {
	ID string `msgpack:"id"`
}

// BuildWaitArgs long-polls a job: the answer comes once the job's Seq is
// greater than Seq, or after Wait (0: the tracker's default, about 10 s).
type BuildWaitArgs struct {
	ID   string        `msgpack:"id"`
	Seq  uint64        `msgpack:"seq"`
	Wait time.Duration `msgpack:"wait,omitempty"`
	// Position, when set, is the queue position the client last saw (-1:
	// none yet): the answer also comes once a queued job's position
	// differs.
	Position int `msgpack:"position,omitempty"`
}

// BuildTakeArgs is a compiler node asking for a job matching its targets.
type BuildTakeArgs struct {
	NodeID string        `msgpack:"node_id"`
	Wait   time.Duration `msgpack:"wait,omitempty"`
}

// BuildTakeReply carries the job taken (Module filled in), or nil.
type BuildTakeReply struct {
	Job *BuildJob `msgpack:"job,omitempty"`
}

// BuildProgressArgs reports a running job's progress (Fraction in [0, 1]).
type BuildProgressArgs struct {
	ID       string  `msgpack:"id"`
	NodeID   string  `msgpack:"node_id"`
	Fraction float64 `msgpack:"fraction"`
	Message  string  `msgpack:"message,omitempty"`
}

// BuildCompleteArgs finishes a job: the artifact (already uploaded) by sha256.
type BuildCompleteArgs struct {
	ID       string `msgpack:"id"`
	NodeID   string `msgpack:"node_id"`
	Artifact string `msgpack:"artifact"`
	Log      string `msgpack:"log,omitempty"`
}

// BuildFailArgs fails a job with the compiler's message.
type BuildFailArgs struct {
	ID      string `msgpack:"id"`
	NodeID  string `msgpack:"node_id"`
	Message string `msgpack:"message"`
	Log     string `msgpack:"log,omitempty"`
}

// ValidSHA256 checks that s is a lowercase hex sha256 (an artifact name).
func ValidSHA256(s string) error {
	if len(s) != 64 {
		return fmt.Errorf("artifact name %q: want 64 hex digits of sha256: %w", s, ErrBadRequest)
	}
	for _, c := range s {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return fmt.Errorf("artifact name %q: want lowercase hex sha256: %w", s, ErrBadRequest)
		}
	}
	return nil
}
