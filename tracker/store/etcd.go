package store

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kiln-ml/kiln/rpcserver/proto"
)

// Etcd keeps the tracker's state in etcd, a key a record
// (prefix + table + "/" + key, the value as the codec encodes it). Queued writes are committed in batches, a batch in one etcd
// transaction guarded by fence: the comparisons that hold only while this
// tracker is the elected leader, so a replica that lost its leadership
// can never write. A transaction that fails its guard makes the store
// fenced for good: every later write fails, and the replica that owns it
// steps down. A transaction that fails because etcd cannot be reached is
// tried again (the same puts and deletes: trying again is harmless) until
// it succeeds, its guard fails or the store closes; meanwhile ready
// reports the failure and the batch's callers wait.
type Etcd struct {
	cli    *clientv3.Client
	prefix string
	fence  []clientv3.Cmp
	hooks  Hooks

	groupCommit

	stateMu sync.Mutex
	lastErr error // the last transaction's failure, nil after a success
	fenced  error // set when a guarded transaction failed its guard
	lost    chan struct{}

	quit     chan struct{} // closed by abandon: stop trying batches again
	quitOnce sync.Once
}

var _ Backend = (*Etcd)(nil)

const (
	// etcdMaxOps is the most operations in one transaction (etcd's
	// default --max-txn-ops is 128).
	etcdMaxOps = 128
	// etcdMaxTxnBytes is the most value bytes in one transaction, under
	// etcd's default request limit of 1.5 MiB.
	etcdMaxTxnBytes = 1 << 20
	// EtcdMaxValue is the largest record the etcd backend writes.
	EtcdMaxValue = etcdMaxTxnBytes
	// EtcdCallTimeout bounds one etcd call; a transaction that times out
	// is tried again.
	EtcdCallTimeout = 5 * time.Second
	// etcdCloseGrace is how long close keeps trying queued batches while
	// etcd cannot be reached.
	etcdCloseGrace = 2 * time.Second
	// EtcdProbeTimeout bounds a readiness probe.
	EtcdProbeTimeout = time.Second
)

// ErrFenced is what writes fail with once the store's guard has failed.
var ErrFenced = fmt.Errorf("this tracker replica is no longer the leader: its writes are refused: %w", proto.ErrUnavailable)

// OpenEtcd returns a store over cli under prefix (which should end in
// "/"), writing only while every comparison in fence holds.
func OpenEtcd(cli *clientv3.Client, prefix string, fence []clientv3.Cmp, hooks Hooks) *Etcd {
	st := &Etcd{cli: cli, prefix: prefix, fence: fence, hooks: hooks, lost: make(chan struct{}), quit: make(chan struct{})}
	st.start(st.commit)
	return st
}

func (st *Etcd) key(t Table, key string) string { return st.prefix + t.String() + "/" + key }

// commit writes batch in one transaction, or in several in order when it
// is larger than etcd takes in one request; a write that cannot be
// encoded, or holds a record larger than EtcdMaxValue, fails alone.
func (st *Etcd) commit(batch []pendingWrite) {
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

func checkSizes(enc []encoded) error {
	for _, c := range enc {
		if len(c.Value) > EtcdMaxValue {
			return fmt.Errorf("%s/%s: a record of %d bytes is larger than the etcd store takes (%d): %w", c.Table, c.Key, len(c.Value), EtcdMaxValue, proto.ErrTooLarge)
		}
	}
	return nil
}

// txn commits ops in one guarded transaction, trying again while etcd
// cannot be reached.
func (st *Etcd) txn(ops []clientv3.Op) error {
	backoff := 50 * time.Millisecond
	var giveUp <-chan time.Time
	for {
		if err := st.fencedErr(); err != nil {
			return err
		}
		t0 := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), EtcdCallTimeout)
		resp, err := st.cli.Txn(ctx).If(st.fence...).Then(ops...).Commit()
		cancel()
		if err == nil && !resp.Succeeded {
			st.setFenced()
			return ErrFenced
		}
		st.setErr(err)
		if err == nil {
			if st.hooks.Synced != nil {
				st.hooks.Synced(time.Since(t0))
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
			return ErrFenced
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

func (st *Etcd) setErr(err error) {
	st.stateMu.Lock()
	st.lastErr = err
	st.stateMu.Unlock()
}

func (st *Etcd) setFenced() {
	st.stateMu.Lock()
	defer st.stateMu.Unlock()
	if st.fenced == nil {
		st.fenced = ErrFenced
		close(st.lost)
	}
}

func (st *Etcd) fencedErr() error {
	st.stateMu.Lock()
	defer st.stateMu.Unlock()
	return st.fenced
}

// Abandon makes the store give up the batch it is trying again and fail
// every later one, as a fenced store does: its owner lost the leadership
// the fence stands for while etcd could not be reached.
func (st *Etcd) Abandon() {
	st.quitOnce.Do(func() { close(st.quit) })
	st.setFenced()
}

// Fenced is closed when a write fails its guard.
func (st *Etcd) Fenced() <-chan struct{} { return st.lost }

// Ready reports whether the last transaction (or probe) reached etcd and
// the store may still write.
func (st *Etcd) Ready() error {
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

// Probe checks that etcd answers and that the guard still holds, and
// records the result for ready; the store's owner calls it now and then
// so that readiness follows etcd while no write is made.
func (st *Etcd) Probe(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, EtcdProbeTimeout)
	defer cancel()
	resp, err := st.cli.Txn(ctx).If(st.fence...).Commit()
	if err == nil && !resp.Succeeded {
		st.setFenced()
		return ErrFenced
	}
	st.setErr(err)
	return err
}

// Get reads one record.
func (st *Etcd) Get(t Table, key string) ([]byte, bool, error) {
	ctx, cancel := context.WithTimeout(context.Background(), EtcdCallTimeout)
	defer cancel()
	resp, err := st.cli.Get(ctx, st.key(t, key))
	if err != nil {
		return nil, false, fmt.Errorf("etcd: read %s/%s: %w", t, key, err)
	}
	if len(resp.Kvs) == 0 {
		return nil, false, nil
	}
	return resp.Kvs[0].Value, true, nil
}

// Load reads every table at one revision.
func (st *Etcd) Load() (Snapshot, error) {
	snap := Snapshot{}
	ctx, cancel := context.WithTimeout(context.Background(), 4*EtcdCallTimeout)
	defer cancel()
	resp, err := st.cli.Get(ctx, st.prefix, clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend))
	if err != nil {
		return snap, fmt.Errorf("etcd: read %s: %w", st.prefix, err)
	}
	for _, kv := range resp.Kvs {
		name, key, ok := strings.Cut(strings.TrimPrefix(string(kv.Key), st.prefix), "/")
		if !ok {
			continue
		}
		if t, ok := tableNamed(name); ok {
			snap[t] = append(snap[t], Record{Key: key, Value: kv.Value})
		}
	}
	return snap, nil
}

// Close commits what is queued (giving up after etcdCloseGrace while etcd
// cannot be reached); it leaves the client open: its owner closes it.
func (st *Etcd) Close() error {
	st.groupCommit.stop()
	return nil
}
