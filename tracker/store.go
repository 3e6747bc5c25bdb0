package tracker

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/vmihailenco/msgpack/v5"
	bolt "go.etcd.io/bbolt"
)

// Buckets of tracker.db.
var (
	bucketJobs      = []byte("jobs")        // job id → jobRecord
	bucketModules   = []byte("modules")     // job id → module text
	bucketArtifacts = []byte("artifacts")   // sha256 → artifactRecord
	bucketLeases    = []byte("leases")      // lease id → leaseRecord
	bucketMeta      = []byte("meta")        // "next_job" → uint64
	bucketCreds     = []byte("credentials") // node id → credential
)

var keyNextJob = []byte("next_job")

// store is tracker.db with group commit: writes are queued in order and a
// single goroutine applies every queued write in one transaction, so many
// concurrent writers share one fsync.
type store struct {
	db *bolt.DB

	// commitMu is held by whichever goroutine applies a batch: the commit
	// loop, or a caller waiting in wait that found no commit running.
	commitMu sync.Mutex

	mu      sync.Mutex
	queue   []pendingWrite
	wake    chan struct{} // 1-buffered: the committer has work
	closing bool
	done    chan struct{} // closed when the committer has returned
}

type pendingWrite struct {
	fn   func(tx *bolt.Tx) error
	done chan error // 1-buffered
}

func openStore(path string) (*store, error) {
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
		for _, b := range [][]byte{bucketJobs, bucketModules, bucketArtifacts, bucketLeases, bucketMeta, bucketCreds} {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("create buckets in %s: %w", path, err)
	}
	st := &store{db: db, wake: make(chan struct{}, 1), done: make(chan struct{})}
	go st.commitLoop()
	return st, nil
}

// write queues fn and returns a channel that receives the commit's result.
// Writes commit in the order they were queued; callers queue while holding
// the tracker's lock, so the database sees changes in the order they happened.
func (st *store) write(fn func(tx *bolt.Tx) error) <-chan error {
	done := make(chan error, 1)
	st.mu.Lock()
	if st.closing {
		st.mu.Unlock()
		done <- errors.New("tracker store is closed")
		return done
	}
	st.queue = append(st.queue, pendingWrite{fn: fn, done: done})
	st.mu.Unlock()
	select {
	case st.wake <- struct{}{}:
	default:
	}
	return done
}

// take removes and returns the queued writes, and whether the store is
// closing.
func (st *store) take() ([]pendingWrite, bool) {
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
func (st *store) wait(done <-chan error) error {
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

func (st *store) commitLoop() {
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
func (st *store) commit(batch []pendingWrite) {
	err := st.db.Update(func(tx *bolt.Tx) error {
		for _, w := range batch {
			if err := w.fn(tx); err != nil {
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
		w.done <- st.db.Update(w.fn)
	}
}

// view runs a read-only transaction.
func (st *store) view(fn func(tx *bolt.Tx) error) error { return st.db.View(fn) }

// close commits what is queued and closes the database. It is idempotent.
func (st *store) close() error {
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

func put(tx *bolt.Tx, bucket []byte, key string, v any) error {
	b, err := msgpack.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode %s/%s: %w", bucket, key, err)
	}
	return tx.Bucket(bucket).Put([]byte(key), b)
}

func del(tx *bolt.Tx, bucket []byte, key string) error {
	return tx.Bucket(bucket).Delete([]byte(key))
}

// putCredential stores a node credential and returns once it is durable.
func (st *store) putCredential(ctx context.Context, c *credential) error {
	return <-st.write(func(tx *bolt.Tx) error { return put(tx, bucketCreds, c.NodeID, c) })
}
