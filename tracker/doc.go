// Package tracker owns kiln's tracker daemon: the registry of device
// daemons and compiler nodes and their heartbeats, per-key lease queues
// with priorities and attribute selectors, leases, quarantine, the durable
// build-job queue, the artifact store, the Apache TVM tracker-protocol
// listener and the /metrics endpoint.
//
// tracker builds on rpcserver/proto (the wire types and the RPC endpoint),
// tracker/store (its state layer, over bbolt or etcd) and etcd's client
// and embedded server. It must not import client, cli, rpcserver (the
// daemon), the compiler, vm or devices: it moves text and bytes, it never
// builds or runs them.
//
// # State and persistence
//
// The tracker keeps its working state in memory and its durable state
// behind one interface (store.Backend, in package tracker/store): it tells
// the store each change as a record put or deleted in a table (jobs,
// modules, artifacts, leases, credentials, meta, results), waits where a
// change must be durable before it answers, and reads everything back at
// start, decoding it with the store's one codec. No storage type crosses
// that interface; store.Bolt (the default) and store.Etcd implement it.
//
// DataDir/tracker.db (bbolt) holds build jobs with their modules, the
// artifact index, the outstanding leases and node credentials; artifacts
// live under DataDir/artifacts/<sha256[:2]>/<sha256>. A write is durable
// before the call that made it returns. Writes from concurrent calls
// share one record of a write-ahead log (DataDir/tracker.db.wal, made
// zero-filled so that a sync writes data, not file metadata) and its one
// fdatasync (group commit), written by a commit loop or, when no commit
// is running, by the waiting caller itself, which saves a hand-off
// between goroutines on a machine short of CPU. Logged batches reach
// tracker.db in a synced transaction at most once every 50 ms (a checkpoint,
// which also records the last batch applied); on open the batches logged
// after it are applied again, and a torn last record is dropped. A batch
// too large for the log goes to tracker.db directly. bbolt runs without
// writing its free-page list at each commit (it is rebuilt on open), as
// etcd runs it. On start the tracker loads jobs (running ones go back to
// the queue: their compiler node is gone with the old process's
// connections) and the leases not yet expired. Leases are persisted, not
// invalidated: a lease stays valid across a restart until it expires or is
// released, and the device it names stays busy when it re-registers, so a
// lease is never handed out twice. Queued lease requests are not
// persisted: they belong to client connections, which a restart ends.
// The registry is not persisted either: nodes re-register when their
// heartbeat answers not_found or their connection drops.
//
// # Replicas over etcd
//
// With Config.Store (etcd://...) or Config.Cluster (an embedded etcd
// member, go.etcd.io/etcd/server/v3/embed, in the tracker's process) the
// state lives in etcd (store.Etcd: a key per record under /kiln/tracker/)
// and several trackers are replicas of one. The choice is an elected
// leader with fenced writes, not every request as etcd transactions: the
// leader keeps the working state in memory exactly as a single tracker
// does (queues, fairness, expiry sweeps, the registry, which all need one
// place that sees every request) and tells etcd every change; the queued
// changes of concurrent calls go in one etcd transaction, so grants cost
// a shared round of consensus rather than one each. Each transaction is
// guarded by If(CreateRevision(leader key) == the leader's own), so a
// replica that lost its leadership (its session lapsed while it could not
// reach etcd, or it was stopped abruptly and came back) can never write:
// a grant or a job claim happens once, by the one leader, or not at all.
// A write that fails its guard ends the term.
//
// Replicas campaign with go.etcd.io/etcd/client/v3/concurrency under a
// session of ElectionTTL (default 2 s): when the leader dies its key
// lapses within that and the next candidate leads. A follower whose
// forwarded connections the leader's address refuses (no process listens
// there) revokes the leader's session at once rather than wait; that is
// safe because a revoked leader can no longer write. Leading is a term: a
// tracker of the term's own is built by loading the snapshot from etcd
// (running jobs requeued, leases kept as after a restart) and serves the
// replica's listeners; when the term ends that tracker stops and closes
// its connections, and the replica campaigns again. Every replica accepts
// every connection: a follower forwards kiln and TVM connections byte for
// byte (TLS stays end to end) to the leader's advertised addresses, the
// election key's value, and closes them when the leader changes, so
// clients, daemons and compiler nodes reconnect and re-register (they
// take several tracker addresses and retry on unavailable). Each replica
// serves /metrics (the leader's tracker's while it leads), /healthz and
// /readyz.
//
// Device liveness needs nothing in etcd: the registry lives in the
// leader's memory and is rebuilt as nodes register with a new leader, so
// a dead tracker holds no device. While etcd cannot be reached the leader
// is not ready and refuses new leases, build jobs and job claims with
// unavailable (retryable); writes already queued are tried again until
// etcd answers, and if the leadership lapses meanwhile the next leader
// starts from what etcd holds. The first replica records a hash of its
// token in etcd; a replica started with another token is refused. Keep
// artifacts where every replica reaches them (a shared directory or an
// S3 bucket, Config.Artifacts): the index is in etcd, the bytes are not.
// A record larger than 1 MiB cannot be stored in etcd: over etcd, modules
// larger than that are refused at submission.
//
// # Health
//
// A node silent for LostAfter (or whose connection drops) is lost: it gets
// no new lease and its running build jobs are requeued. ReportFailure
// reports (from the daemon or a lease holder) are counted; QuarantineAfter
// of them within FailureWindow quarantine a device. A quarantined device
// gets no lease; its heartbeat replies ask it for a health check, and a
// passing ReportHealth report lifts the quarantine and clears its count.
//
// # TVM protocol
//
// When TVMListen is set the tracker also speaks Apache TVM's tracker
// protocol there (tvm.rpc.tracker): TVM rpc servers PUT themselves,
// runners REQUEST them, SUMMARY lists the TVM servers and their queues.
// kiln's own devices stay out of SUMMARY and are never matched with a TVM
// REQUEST: kiln daemons speak another protocol, and their keys and
// addresses must not reach an unauthenticated peer (kiln's own summary,
// kiln query, lists both). TVM's protocol carries no token, so
// that listener is unauthenticated: bind it to a trusted network.
package tracker
