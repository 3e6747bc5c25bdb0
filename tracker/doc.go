// Package tracker owns kiln's tracker daemon: the registry of device
// daemons and compiler nodes and their heartbeats, per-key lease queues
// with priorities and attribute selectors, leases, quarantine, the durable
// build-job queue, the artifact store, the Apache TVM tracker-protocol
// listener and the /metrics endpoint.
//
// tracker builds on rpcserver/proto (the wire types and the RPC endpoint)
// and bbolt. It must not import client, cli, rpcserver (the daemon), the
// compiler, vm or devices: it moves text and bytes, it never builds or runs
// them.
//
// # State and persistence
//
// The tracker keeps its working state in memory and its durable state
// behind one interface (stateStore): it tells the store each change as a
// record put or deleted in a table (jobs, modules, artifacts, leases,
// credentials, meta), waits where a change must be durable before it
// answers, and reads everything back at start. No storage type crosses
// that interface; boltStore is the implementation.
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
// runners REQUEST them, SUMMARY lists both TVM servers and kiln devices
// (kiln devices as server_info entries with "kiln": true and in queue_info
// under their key). A TVM REQUEST is only ever matched with a TVM server:
// kiln daemons speak another protocol. TVM's protocol carries no token, so
// that listener is unauthenticated: bind it to a trusted network.
package tracker
