package tracker

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/vmihailenco/msgpack/v5"
	bolt "go.etcd.io/bbolt"
)

// boltStore keeps the tracker's state in one bbolt file, a bucket a table,
// with group commit: changes are queued in order and applied in batches,
// one transaction (and its fsyncs) a batch, so many concurrent writers
// share one commit.
type boltStore struct {
	db *bolt.DB

	// commitMu is held by whichever goroutine applies a batch: the commit
	// loop, or a caller in wait that found no commit running.
	commitMu sync.Mutex

	mu      sync.Mutex
	queue   []pendingWrite
	wake    chan struct{} // 1-buffered: the committer has work
	closing bool
	done    chan struct{} // closed when the committer has returned
}

var _ stateStore = (*boltStore)(nil)

type pendingWrite struct {
	changes []change
	done    chan error // 1-buffered
}

var boltTables = []table{tableJobs, tableModules, tableArtifacts, tableLeases, tableCreds, tableMeta}

func bucketName(t table) []byte { return []byte(t.String()) }

func openBoltStore(path string) (*boltStore, error) {
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
	st := &boltStore{db: db, wake: make(chan struct{}, 1), done: make(chan struct{})}
	go st.commitLoop()
	return st, nil
}

func (st *boltStore) apply(changes ...change) <-chan error {
	done := make(chan error, 1)
	st.mu.Lock()
	if st.closing {
		st.mu.Unlock()
		done <- errors.New("tracker store is closed")
		return done
	}
	st.queue = append(st.queue, pendingWrite{changes: changes, done: done})
	st.mu.Unlock()
	select {
	case st.wake <- struct{}{}:
	default:
	}
	return done
}

// take removes and returns the queued writes, and whether the store is
// closing.
func (st *boltStore) take() ([]pendingWrite, bool) {
	st.mu.Lock()
	defer st.mu.Unlock()
	batch := st.queue
	st.queue = nil
	return batch, st.closing
}

// wait returns the result of the write whose channel is done. When no
// commit is running it commits the queue itself rather than waking the
// commit loop and waiting for it: one hand-off less between a write and
// its caller's answer, which counts on a machine short of CPU.
func (st *boltStore) wait(done <-chan error) error {
	select {
	case err := <-done:
		return err
	default:
	}
	if st.commitMu.TryLock() {
		if batch, _ := st.take(); len(batch) > 0 {
			st.commit(batch)
		}
		st.commitMu.Unlock()
	}
	// Either that commit held this write, or an earlier one did, or the
	// commit loop (woken when the write was queued) is applying it now.
	return <-done
}

func (st *boltStore) commitLoop() {
	defer close(st.done)
	for {
		st.commitMu.Lock()
		batch, closing := st.take()
		if len(batch) > 0 {
			st.commit(batch)
		}
		st.commitMu.Unlock()
		if len(batch) > 0 {
			continue
		}
		if closing {
			return
		}
		<-st.wake
	}
}

// commit applies batch in one transaction; when that fails it retries each
// write alone, so one bad write fails only its own caller.
func (st *boltStore) commit(batch []pendingWrite) {
	err := st.db.Update(func(tx *bolt.Tx) error {
		for _, w := range batch {
			if err := applyChanges(tx, w.changes); err != nil {
				return err
			}
		}
		return nil
	})
	if err == nil {
		for _, w := range batch {
			w.done <- nil
		}
		return
	}
	for _, w := range batch {
		w.done <- st.db.Update(func(tx *bolt.Tx) error { return applyChanges(tx, w.changes) })
	}
}

// applyChanges writes changes in tx: a string value as its bytes, any
// other value msgpack-encoded.
func applyChanges(tx *bolt.Tx, changes []change) error {
	for _, c := range changes {
		b := tx.Bucket(bucketName(c.table))
		if b == nil {
			return fmt.Errorf("store: unknown table %d", c.table)
		}
		var err error
		switch v := c.value.(type) {
		case nil:
			err = b.Delete([]byte(c.key))
		case string:
			err = b.Put([]byte(c.key), []byte(v))
		default:
			var enc []byte
			if enc, err = msgpack.Marshal(v); err != nil {
				return fmt.Errorf("encode %s/%s: %w", c.table, c.key, err)
			}
			err = b.Put([]byte(c.key), enc)
		}
		if err != nil {
			return fmt.Errorf("%s/%s: %w", c.table, c.key, err)
		}
	}
	return nil
}

func (st *boltStore) artifact(sha string) (artifactRecord, bool, error) {
	var rec artifactRecord
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
	st.mu.Lock()
	already := st.closing
	st.closing = true
	st.mu.Unlock()
	if already {
		<-st.done
		return nil
	}
	select {
	case st.wake <- struct{}{}:
	default:
	}
	<-st.done
	if err := st.db.Close(); err != nil {
		return fmt.Errorf("close tracker store: %w", err)
	}
	return nil
}
