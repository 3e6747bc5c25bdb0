package tracker

import (
	"fmt"
	"sync"
	"time"

	"github.com/vmihailenco/msgpack/v5"
	bolt "go.etcd.io/bbolt"

	"github.com/kiln-ml/kiln/rpcserver/proto"
)

// boltStore keeps the tracker's state in one bbolt file, a bucket a table,
// behind a write-ahead log (see store_wal.go), with group commit: changes
// are queued in order and written in batches, one log record and one
// fdatasync a batch, so many concurrent writers share one sync; the
// logged batches reach tracker.db in checkpoints.
type boltStore struct {
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

	hooks storeHooks

	groupCommit
}

var _ stateStore = (*boltStore)(nil)

// storeHooks observe a store's work (for metrics); nil ones are skipped.
type storeHooks struct {
	synced       func(time.Duration) // a batch logged and synced
	checkpointed func(time.Duration) // logged batches applied to tracker.db
}

// ckptInterval is the least time between two checkpoints.
const ckptInterval = 50 * time.Millisecond

// metaWALSeq is the meta record of the last logged batch tracker.db holds.
const metaWALSeq = "wal_seq"

var boltTables = []table{tableJobs, tableModules, tableArtifacts, tableLeases, tableCreds, tableMeta, tableResults}

func bucketName(t table) []byte { return []byte(t.String()) }

// openBoltStore opens tracker.db at path and its log at path+".wal",
// applying the batches logged after the last checkpoint.
func openBoltStore(path string, hooks storeHooks) (*boltStore, error) {
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
		for _, t := range boltTables {
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
	st := &boltStore{
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
func (st *boltStore) recover() error {
	var applied uint64
	err := st.db.View(func(tx *bolt.Tx) error {
		if b := tx.Bucket(bucketName(tableMeta)).Get([]byte(metaWALSeq)); b != nil {
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
func (st *boltStore) applyDB(recs []walRecord) error {
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
		return tx.Bucket(bucketName(tableMeta)).Put([]byte(metaWALSeq), enc)
	})
}

// checkpoint applies what is logged to tracker.db.
func (st *boltStore) checkpoint() error {
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
	if st.hooks.checkpointed != nil {
		st.hooks.checkpointed(time.Since(t0))
	}
	st.pendMu.Lock()
	st.pending = st.pending[len(recs):]
	st.pendMu.Unlock()
	return nil
}

// checkpointLoop checkpoints at most every ckptInterval while batches are
// logged, and starts the log over when everything in it is applied and no
// batch is being logged.
func (st *boltStore) checkpointLoop() {
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
func (st *boltStore) commit(batch []pendingWrite) {
	var ok []pendingWrite
	var changes []walChange
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
	if st.hooks.synced != nil {
		st.hooks.synced(time.Since(t0))
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

func (st *boltStore) artifact(sha string) (artifactRecord, bool, error) {
	var rec artifactRecord
	// What is logged and not yet checkpointed is newer than tracker.db.
	st.pendMu.Lock()
	for i := len(st.pending) - 1; i >= 0; i-- {
		ch := st.pending[i].Changes
		for k := len(ch) - 1; k >= 0; k-- {
			if c := ch[k]; c.Table == tableArtifacts && c.Key == sha {
				st.pendMu.Unlock()
				if c.Delete {
					return rec, false, nil
				}
				return rec, true, msgpack.Unmarshal(c.Value, &rec)
			}
		}
	}
	st.pendMu.Unlock()
	found := false
	err := st.db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketName(tableArtifacts)).Get([]byte(sha))
		if b == nil {
			return nil
		}
		found = true
		return msgpack.Unmarshal(b, &rec)
	})
	return rec, found, err
}

func (st *boltStore) load() (snapshot, error) {
	snap := snapshot{artifacts: make(map[string]artifactRecord)}
	if err := st.checkpoint(); err != nil {
		return snap, fmt.Errorf("checkpoint: %w", err)
	}
	err := st.db.View(func(tx *bolt.Tx) error {
		if b := tx.Bucket(bucketName(tableMeta)).Get([]byte(metaNextJob)); b != nil {
			if err := msgpack.Unmarshal(b, &snap.nextJob); err != nil {
				return fmt.Errorf("next job counter: %w", err)
			}
		}
		modules := tx.Bucket(bucketName(tableModules))
		err := tx.Bucket(bucketName(tableJobs)).ForEach(func(k, v []byte) error {
			var sj storedJob
			if err := msgpack.Unmarshal(v, &sj.rec); err != nil {
				return fmt.Errorf("job %s: %w", k, err)
			}
			sj.module = string(modules.Get(k))
			snap.jobs = append(snap.jobs, sj)
			return nil
		})
		if err != nil {
			return err
		}
		err = tx.Bucket(bucketName(tableArtifacts)).ForEach(func(k, v []byte) error {
			var rec artifactRecord
			if err := msgpack.Unmarshal(v, &rec); err != nil {
				return fmt.Errorf("artifact %s: %w", k, err)
			}
			snap.artifacts[string(k)] = rec
			return nil
		})
		if err != nil {
			return err
		}
		err = tx.Bucket(bucketName(tableCreds)).ForEach(func(k, v []byte) error {
			var c credential
			if err := msgpack.Unmarshal(v, &c); err != nil {
				return fmt.Errorf("credential of node %s: %w", k, err)
			}
			snap.creds = append(snap.creds, c)
			return nil
		})
		if err != nil {
			return err
		}
		err = tx.Bucket(bucketName(tableResults)).ForEach(func(k, v []byte) error {
			var r proto.Result
			if err := msgpack.Unmarshal(v, &r); err != nil {
				return fmt.Errorf("result %s: %w", k, err)
			}
			snap.results = append(snap.results, r)
			return nil
		})
		if err != nil {
			return err
		}
		return tx.Bucket(bucketName(tableLeases)).ForEach(func(k, v []byte) error {
			var rec leaseRecord
			if err := msgpack.Unmarshal(v, &rec); err != nil {
				return fmt.Errorf("lease %s: %w", k, err)
			}
			snap.leases = append(snap.leases, rec)
			return nil
		})
	})
	return snap, err
}

// close commits what is queued and closes the database. It is idempotent.
func (st *boltStore) close() error {
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
