package store

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/vmihailenco/msgpack/v5"
	bolt "go.etcd.io/bbolt"
)

// Bolt keeps the tracker's state in one bbolt file, a bucket a table,
// behind a write-ahead log (see wal.go), with group commit: changes
// are queued in order and written in batches, one log record and one
// fdatasync a batch, so many concurrent writers share one sync; the
// logged batches reach tracker.db in checkpoints.
type Bolt struct {
	db  *bolt.DB
	log *wal
	seq uint64 // the last batch logged (under commitMu)

	// ckptMu is held during a checkpoint; pending (under pendMu) is what
	// is logged and not yet in tracker.db, in order.
	ckptMu   sync.Mutex
	pendMu   sync.Mutex
	pending  []walRecord
	ckptWake chan struct{} // 1-buffered
	ckptStop chan struct{}
	ckptDone chan struct{}

	hooks Hooks

	groupCommit
}

var _ Backend = (*Bolt)(nil)

// ckptInterval is the least time between two checkpoints.
const ckptInterval = 50 * time.Millisecond

func bucketName(t Table) []byte { return []byte(t.String()) }

// OpenBolt opens tracker.db at path and its log at path+".wal",
// applying the batches logged after the last checkpoint.
func OpenBolt(path string, hooks Hooks) (*Bolt, error) {
	db, err := bolt.Open(path, 0o600, &bolt.Options{
		Timeout: 2 * time.Second,
		// The free-page list is rebuilt by scanning on open rather than
		// written at every commit: one page less to write and sync per
		// batch (etcd runs bbolt the same way).
		NoFreelistSync: true,
		FreelistType:   bolt.FreelistMapType,
		// Map enough up front that growth does not remap (which waits
		// for every open read transaction) under load.
		InitialMmapSize: 64 << 20,
	})
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		for _, t := range tables {
			if _, err := tx.CreateBucketIfNotExists(bucketName(t)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("create buckets in %s: %w", path, err)
	}
	st := &Bolt{
		db:       db,
		ckptWake: make(chan struct{}, 1), ckptStop: make(chan struct{}), ckptDone: make(chan struct{}),
		hooks: hooks,
	}
	if st.log, err = openWAL(path + ".wal"); err != nil {
		db.Close()
		return nil, err
	}
	if err := st.recover(); err != nil {
		st.log.close()
		db.Close()
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	st.start(st.commit)
	go st.checkpointLoop()
	return st, nil
}

// recover applies the logged batches tracker.db does not hold yet and
// starts the log over.
func (st *Bolt) recover() error {
	var applied uint64
	err := st.db.View(func(tx *bolt.Tx) error {
		if b := tx.Bucket(bucketName(Meta)).Get([]byte(metaWALSeq)); b != nil {
			return msgpack.Unmarshal(b, &applied)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("read the applied log position: %w", err)
	}
	recs, err := st.log.records()
	if err != nil {
		return err
	}
	var todo []walRecord
	for _, r := range recs {
		if r.Seq > applied {
			todo = append(todo, r)
		}
	}
	if len(todo) > 0 && todo[0].Seq != applied+1 {
		return fmt.Errorf("write-ahead log: it resumes at batch %d but tracker.db holds batches up to %d: batches %d to %d are missing", todo[0].Seq, applied, applied+1, todo[0].Seq-1)
	}
	st.seq = applied
	if len(todo) > 0 {
		if err := st.applyDB(todo); err != nil {
			return fmt.Errorf("apply the write-ahead log: %w", err)
		}
		st.seq = todo[len(todo)-1].Seq
	}
	st.log.off = 0
	return nil
}

// applyDB applies logged batches to tracker.db in one synced transaction,
// with the last one's number.
func (st *Bolt) applyDB(recs []walRecord) error {
	return st.db.Update(func(tx *bolt.Tx) error {
		for _, r := range recs {
			for _, c := range r.Changes {
				b := tx.Bucket(bucketName(c.Table))
				if b == nil {
					return fmt.Errorf("batch %d: unknown table %d", r.Seq, c.Table)
				}
				var err error
				if c.Delete {
					err = b.Delete([]byte(c.Key))
				} else {
					err = b.Put([]byte(c.Key), c.Value)
				}
				if err != nil {
					return fmt.Errorf("batch %d: %s/%s: %w", r.Seq, c.Table, c.Key, err)
				}
			}
		}
		enc, _ := msgpack.Marshal(recs[len(recs)-1].Seq)
		return tx.Bucket(bucketName(Meta)).Put([]byte(metaWALSeq), enc)
	})
}

// checkpoint applies what is logged to tracker.db.
func (st *Bolt) checkpoint() error {
	st.ckptMu.Lock()
	defer st.ckptMu.Unlock()
	st.pendMu.Lock()
	recs := st.pending
	st.pendMu.Unlock()
	if len(recs) == 0 {
		return nil
	}
	t0 := time.Now()
	if err := st.applyDB(recs); err != nil {
		return err
	}
	if st.hooks.Checkpointed != nil {
		st.hooks.Checkpointed(time.Since(t0))
	}
	st.pendMu.Lock()
	st.pending = st.pending[len(recs):]
	st.pendMu.Unlock()
	return nil
}

// checkpointLoop checkpoints at most every ckptInterval while batches are
// logged, and starts the log over when everything in it is applied and no
// batch is being logged.
func (st *Bolt) checkpointLoop() {
	defer close(st.ckptDone)
	for {
		select {
		case <-st.ckptStop:
			return
		case <-st.ckptWake:
		}
		if err := st.checkpoint(); err != nil {
			// The batches stay logged; the next checkpoint tries again.
			continue
		}
		if st.commitMu.TryLock() {
			st.pendMu.Lock()
			if len(st.pending) == 0 {
				st.log.off = 0
			}
			st.pendMu.Unlock()
			st.commitMu.Unlock()
		}
		select {
		case <-st.ckptStop:
			return
		case <-time.After(ckptInterval):
		}
	}
}

// commit logs batch as one record and answers its writers once it is
// synced; a write whose changes cannot be encoded fails alone. A batch
// too large for the log is applied to tracker.db directly.
func (st *Bolt) commit(batch []pendingWrite) {
	var ok []pendingWrite
	var changes []encoded
	for _, w := range batch {
		enc, err := encodeChanges(w.changes)
		if err != nil {
			w.done <- err
			continue
		}
		ok = append(ok, w)
		changes = append(changes, enc...)
	}
	if len(ok) == 0 {
		return
	}
	reply := func(err error) { answer(ok, err) }
	rec := walRecord{Seq: st.seq + 1, Changes: changes}
	payload, err := msgpack.Marshal(rec)
	if err != nil {
		reply(fmt.Errorf("write-ahead log: encode: %w", err))
		return
	}
	if !st.log.fits(len(payload)) {
		// Apply what is logged, then start the log over.
		if err := st.checkpoint(); err != nil {
			reply(fmt.Errorf("checkpoint: %w", err))
			return
		}
		st.log.off = 0
		if !st.log.fits(len(payload)) {
			err := st.applyDB([]walRecord{rec})
			if err == nil {
				st.seq = rec.Seq
			}
			reply(err)
			return
		}
	}
	t0 := time.Now()
	if err := st.log.append(payload); err != nil {
		reply(err)
		return
	}
	if st.hooks.Synced != nil {
		st.hooks.Synced(time.Since(t0))
	}
	st.seq = rec.Seq
	st.pendMu.Lock()
	st.pending = append(st.pending, rec)
	st.pendMu.Unlock()
	select {
	case st.ckptWake <- struct{}{}:
	default:
	}
	reply(nil)
}

// Get returns a record, from the log when a batch not yet checkpointed
// changed it (that is newer than tracker.db), from tracker.db otherwise.
func (st *Bolt) Get(t Table, key string) ([]byte, bool, error) {
	st.pendMu.Lock()
	for i := len(st.pending) - 1; i >= 0; i-- {
		ch := st.pending[i].Changes
		for k := len(ch) - 1; k >= 0; k-- {
			if c := ch[k]; c.Table == t && c.Key == key {
				st.pendMu.Unlock()
				if c.Delete {
					return nil, false, nil
				}
				return c.Value, true, nil
			}
		}
	}
	st.pendMu.Unlock()
	var out []byte
	err := st.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketName(t))
		if b == nil {
			return fmt.Errorf("unknown table %d", t)
		}
		if v := b.Get([]byte(key)); v != nil {
			out = append([]byte(nil), v...)
		}
		return nil
	})
	if err != nil {
		return nil, false, fmt.Errorf("read %s/%s: %w", t, key, err)
	}
	return out, out != nil, nil
}

// Load checkpoints what is logged and reads every bucket.
func (st *Bolt) Load() (Snapshot, error) {
	snap := Snapshot{}
	if err := st.checkpoint(); err != nil {
		return snap, fmt.Errorf("checkpoint: %w", err)
	}
	err := st.db.View(func(tx *bolt.Tx) error {
		for _, t := range tables {
			err := tx.Bucket(bucketName(t)).ForEach(func(k, v []byte) error {
				if t == Meta && string(k) == metaWALSeq {
					return nil
				}
				snap[t] = append(snap[t], Record{Key: string(k), Value: append([]byte(nil), v...)})
				return nil
			})
			if err != nil {
				return err
			}
		}
		return nil
	})
	return snap, err
}

// Ready is nil: a local file is ready once open.
func (st *Bolt) Ready() error { return nil }

// Probe has nothing to check on a local file.
func (st *Bolt) Probe(context.Context) error { return nil }

// Close commits what is queued and closes the database. It is idempotent.
func (st *Bolt) Close() error {
	if st.stop() {
		return nil
	}
	close(st.ckptStop)
	<-st.ckptDone
	err := st.checkpoint()
	if cerr := st.log.close(); err == nil {
		err = cerr
	}
	if cerr := st.db.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("close tracker store: %w", err)
	}
	return nil
}
