package tracker

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/vmihailenco/msgpack/v5"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kiln-ml/kiln/rpcserver/proto"
)

// etcdStore keeps the tracker's state in etcd, a key a record
// (prefix + table + "/" + key, the value encoded as boltStore encodes
// it). Queued writes are committed in batches, a batch in one etcd
// transaction guarded by fence: the comparisons that hold only while this
// tracker is the elected leader, so a replica that lost its leadership
// can never write. A transaction that fails its guard makes the store
// fenced for good: every later write fails, and the replica that owns it
// steps down. A transaction that fails because etcd cannot be reached is
// tried again (the same puts and deletes: trying again is harmless) until
// it succeeds, its guard fails or the store closes; meanwhile ready
// reports the failure and the batch's callers wait.
type etcdStore struct {
	cli    *clientv3.Client
	prefix string
	fence  []clientv3.Cmp
	hooks  storeHooks

	groupCommit

	stateMu sync.Mutex
	lastErr error // the last transaction's failure, nil after a success
	fenced  error // set when a guarded transaction failed its guard
	lost    chan struct{}

	quit     chan struct{} // closed by abandon: stop trying batches again
	quitOnce sync.Once
}

var _ stateStore = (*etcdStore)(nil)

const (
	// etcdMaxOps is the most operations in one transaction (etcd's
	// default --max-txn-ops is 128).
	etcdMaxOps = 128
	// etcdMaxTxnBytes is the most value bytes in one transaction, under
	// etcd's default request limit of 1.5 MiB.
	etcdMaxTxnBytes = 1 << 20
	// etcdMaxValue is the largest record the store writes.
	etcdMaxValue = etcdMaxTxnBytes
	// etcdCallTimeout bounds one etcd call; a transaction that times out
	// is tried again.
	etcdCallTimeout = 5 * time.Second
	// etcdCloseGrace is how long close keeps trying queued batches while
	// etcd cannot be reached.
	etcdCloseGrace = 2 * time.Second
	// etcdProbeTimeout bounds a readiness probe.
	etcdProbeTimeout = time.Second
)

// errFenced is what writes fail with once the store's guard has failed.
var errFenced = fmt.Errorf("this tracker replica is no longer the leader: its writes are refused: %w", proto.ErrUnavailable)

// openEtcdStore returns a store over cli under prefix (which should end in
// "/"), writing only while every comparison in fence holds.
func openEtcdStore(cli *clientv3.Client, prefix string, fence []clientv3.Cmp, hooks storeHooks) *etcdStore {
	st := &etcdStore{cli: cli, prefix: prefix, fence: fence, hooks: hooks, lost: make(chan struct{}), quit: make(chan struct{})}
	st.start(st.commit)
	return st
}

func (st *etcdStore) key(t table, key string) string { return st.prefix + t.String() + "/" + key }

// commit writes batch in one transaction, or in several in order when it
// is larger than etcd takes in one request; a write that cannot be
// encoded, or holds a record larger than etcdMaxValue, fails alone.
func (st *etcdStore) commit(batch []pendingWrite) {
	var ok []pendingWrite
	var txns [][]clientv3.Op
	var ops []clientv3.Op
	size, at := 0, map[string]int{} // value bytes in ops, and where each key is
	for _, w := range batch {
		enc, err := encodeChanges(w.changes)
		if err == nil {
			err = checkSizes(enc)
		}
		if err != nil {
			w.done <- err
			continue
		}
		ok = append(ok, w)
		for _, c := range enc {
			k := st.key(c.Table, c.Key)
			op := clientv3.OpPut(k, string(c.Value))
			if c.Delete {
				op = clientv3.OpDelete(k)
			}
			// etcd takes a key once in a transaction: a later change
			// of it in the same one replaces the earlier.
			if i, dup := at[k]; dup {
				ops[i] = op
				size += len(c.Value)
				continue
			}
			if len(ops) == etcdMaxOps || size+len(c.Value) > etcdMaxTxnBytes {
				txns = append(txns, ops)
				ops, size, at = nil, 0, map[string]int{}
			}
			at[k] = len(ops)
			ops = append(ops, op)
			size += len(c.Value)
		}
	}
	if len(ops) > 0 {
		txns = append(txns, ops)
	}
	for _, ops := range txns {
		if err := st.txn(ops); err != nil {
			answer(ok, err)
			return
		}
	}
	answer(ok, nil)
}

func checkSizes(enc []walChange) error {
	for _, c := range enc {
		if len(c.Value) > etcdMaxValue {
			return fmt.Errorf("%s/%s: a record of %d bytes is larger than the etcd store takes (%d): %w", c.Table, c.Key, len(c.Value), etcdMaxValue, proto.ErrTooLarge)
		}
	}
	return nil
}

// txn commits ops in one guarded transaction, trying again while etcd
// cannot be reached.
func (st *etcdStore) txn(ops []clientv3.Op) error {
	backoff := 50 * time.Millisecond
	var giveUp <-chan time.Time
	for {
		if err := st.fencedErr(); err != nil {
			return err
		}
		t0 := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), etcdCallTimeout)
		resp, err := st.cli.Txn(ctx).If(st.fence...).Then(ops...).Commit()
		cancel()
		if err == nil && !resp.Succeeded {
			st.setFenced()
			return errFenced
		}
		st.setErr(err)
		if err == nil {
			if st.hooks.synced != nil {
				st.hooks.synced(time.Since(t0))
			}
			return nil
		}
		if permanent(err) {
			return fmt.Errorf("etcd transaction: %w", err)
		}
		if giveUp == nil && st.stopping() {
			giveUp = time.After(etcdCloseGrace)
		}
		select {
		case <-time.After(backoff):
		case <-st.quit:
			return errFenced
		case <-giveUp:
			return fmt.Errorf("etcd transaction: %v: gave up at close: %w", err, proto.ErrUnavailable)
		}
		backoff = min(2*backoff, time.Second)
	}
}

// permanent reports whether trying err's call again cannot help.
func permanent(err error) bool {
	code := status.Code(err)
	var ee rpctypes.EtcdError
	if errors.As(err, &ee) {
		code = ee.Code()
	}
	switch code {
	case codes.InvalidArgument, codes.FailedPrecondition, codes.PermissionDenied,
		codes.Unauthenticated, codes.ResourceExhausted, codes.OutOfRange:
		return true
	}
	return false
}

func (st *etcdStore) setErr(err error) {
	st.stateMu.Lock()
	st.lastErr = err
	st.stateMu.Unlock()
}

func (st *etcdStore) setFenced() {
	st.stateMu.Lock()
	defer st.stateMu.Unlock()
	if st.fenced == nil {
		st.fenced = errFenced
		close(st.lost)
	}
}

func (st *etcdStore) fencedErr() error {
	st.stateMu.Lock()
	defer st.stateMu.Unlock()
	return st.fenced
}

// abandon makes the store give up the batch it is trying again and fail
// every later one, as a fenced store does: its owner lost the leadership
// the fence stands for while etcd could not be reached.
func (st *etcdStore) abandon() {
	st.quitOnce.Do(func() { close(st.quit) })
	st.setFenced()
}

// fencedCh is closed when a write fails its guard.
func (st *etcdStore) fencedCh() <-chan struct{} { return st.lost }

// ready reports whether the last transaction (or probe) reached etcd and
// the store may still write.
func (st *etcdStore) ready() error {
	st.stateMu.Lock()
	defer st.stateMu.Unlock()
	if st.fenced != nil {
		return st.fenced
	}
	if st.lastErr != nil {
		return fmt.Errorf("etcd store unreachable: %v: %w", st.lastErr, proto.ErrUnavailable)
	}
	return nil
}

// probe checks that etcd answers and that the guard still holds, and
// records the result for ready; the store's owner calls it now and then
// so that readiness follows etcd while no write is made.
func (st *etcdStore) probe(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, etcdProbeTimeout)
	defer cancel()
	resp, err := st.cli.Txn(ctx).If(st.fence...).Commit()
	if err == nil && !resp.Succeeded {
		st.setFenced()
		return errFenced
	}
	st.setErr(err)
	return err
}

func (st *etcdStore) artifact(sha string) (artifactRecord, bool, error) {
	var rec artifactRecord
	ctx, cancel := context.WithTimeout(context.Background(), etcdCallTimeout)
	defer cancel()
	resp, err := st.cli.Get(ctx, st.key(tableArtifacts, sha))
	if err != nil {
		return rec, false, fmt.Errorf("etcd: read artifact %s: %w", sha, err)
	}
	if len(resp.Kvs) == 0 {
		return rec, false, nil
	}
	return rec, true, msgpack.Unmarshal(resp.Kvs[0].Value, &rec)
}

// load reads every table at one revision.
func (st *etcdStore) load() (snapshot, error) {
	snap := snapshot{artifacts: make(map[string]artifactRecord)}
	ctx, cancel := context.WithTimeout(context.Background(), 4*etcdCallTimeout)
	defer cancel()
	resp, err := st.cli.Get(ctx, st.prefix, clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend))
	if err != nil {
		return snap, fmt.Errorf("etcd: read %s: %w", st.prefix, err)
	}
	modules := map[string]string{}
	var jobs [][]byte
	for _, kv := range resp.Kvs {
		t, key, ok := strings.Cut(strings.TrimPrefix(string(kv.Key), st.prefix), "/")
		if !ok {
			continue
		}
		var err error
		switch t {
		case tableMeta.String():
			if key == metaNextJob {
				err = msgpack.Unmarshal(kv.Value, &snap.nextJob)
			}
		case tableModules.String():
			modules[key] = string(kv.Value)
		case tableJobs.String():
			jobs = append(jobs, kv.Value)
		case tableArtifacts.String():
			var rec artifactRecord
			err = msgpack.Unmarshal(kv.Value, &rec)
			snap.artifacts[key] = rec
		case tableCreds.String():
			var c credential
			err = msgpack.Unmarshal(kv.Value, &c)
			snap.creds = append(snap.creds, c)
		case tableLeases.String():
			var rec leaseRecord
			err = msgpack.Unmarshal(kv.Value, &rec)
			snap.leases = append(snap.leases, rec)
		case tableResults.String():
			var r proto.Result
			err = msgpack.Unmarshal(kv.Value, &r)
			snap.results = append(snap.results, r)
		}
		if err != nil {
			return snap, fmt.Errorf("etcd: record %s: %w", kv.Key, err)
		}
	}
	for _, v := range jobs {
		var sj storedJob
		if err := msgpack.Unmarshal(v, &sj.rec); err != nil {
			return snap, fmt.Errorf("etcd: job record: %w", err)
		}
		sj.module = modules[sj.rec.Job.ID]
		snap.jobs = append(snap.jobs, sj)
	}
	return snap, nil
}

// close commits what is queued (giving up after etcdCloseGrace while etcd
// cannot be reached); it leaves the client open: its owner closes it.
func (st *etcdStore) close() error {
	st.groupCommit.stop()
	return nil
}
