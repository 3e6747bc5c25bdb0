// Package store is the tracker's state layer: what must survive a tracker
// (build jobs and their modules, the next job number, the artifact index,
// outstanding leases, node credentials and recorded results) kept as
// records keyed within tables, behind one interface, Backend.
//
// The layout follows etcd's server/storage: this file is the interface
// and its vocabulary (tables, changes, snapshots); codec.go is the one
// record codec every backend and every reader shares; schema.go the
// tables and the typed accessors of the records whose types live here;
// batch.go the group-commit queue both backends share; bolt.go and wal.go
// the bbolt backend (tracker.db behind a write-ahead log), etcd.go the
// etcd backend (a key a record, writes fenced by a leadership).
//
// A backend stores values as the codec encodes them and gives them back
// encoded: it never knows the tracker's record types, and the tracker
// never knows how a backend keeps them (transactions, buckets, files).
package store

import (
	"context"
	"fmt"
	"time"
)

// Backend is where a tracker keeps its durable state. The tracker holds
// its working state in memory and tells the backend every change.
type Backend interface {
	// Load returns everything stored.
	Load() (Snapshot, error)
	// Apply queues changes to be applied together, after every change
	// queued before them, and returns a 1-buffered channel that receives
	// the result once they are durable. A failed apply changes nothing.
	// Callers queue while holding the tracker's lock, so the backend
	// sees changes in the order they happened.
	Apply(changes ...Change) <-chan error
	// Wait returns the result on a channel Apply returned; a backend may
	// use the wait to apply queued changes in the caller's goroutine.
	Wait(done <-chan error) error
	// Get returns one record's encoded value (decode it with Decode); ok
	// is false when there is none. It sees every change Apply answered.
	Get(t Table, key string) (value []byte, ok bool, err error)
	// Ready returns nil while the backend takes writes; otherwise an
	// error wrapping proto.ErrUnavailable (its service cannot be reached,
	// or its writes are fenced). A local file is ready once open.
	Ready() error
	// Probe checks now that the backend's service answers and that its
	// writes would be accepted, and records the result for Ready; the
	// owner calls it now and then so that readiness follows the service
	// while no write is made. A local file has nothing to probe.
	Probe(ctx context.Context) error
	// Close applies what is queued and closes the backend; it is
	// idempotent.
	Close() error
}

// Hooks observe a backend's work (for metrics); nil ones are skipped.
type Hooks struct {
	Synced       func(time.Duration) // a batch made durable
	Checkpointed func(time.Duration) // logged batches applied to tracker.db
}

// Change is one record written (Value set) or deleted (Value nil). Value
// is encoded by the codec when the change is committed.
type Change struct {
	Table Table
	Key   string
	Value any
}

// Put returns the change that writes v as t's record key.
func Put(t Table, key string, v any) Change { return Change{Table: t, Key: key, Value: v} }

// Delete returns the change that deletes t's record key.
func Delete(t Table, key string) Change { return Change{Table: t, Key: key} }

// Record is one stored record with its value encoded.
type Record struct {
	Key   string
	Value []byte
}

// Snapshot is everything a backend holds: each table's records, in key
// order.
type Snapshot map[Table][]Record

// Value returns t's record key from the snapshot; ok is false when there
// is none.
func (s Snapshot) Value(t Table, key string) (value []byte, ok bool) {
	for _, r := range s[t] {
		if r.Key == key {
			return r.Value, true
		}
	}
	return nil, false
}

// Each decodes every record of table t into a fresh T and calls fn with
// its key, stopping at the first error (a record that does not decode is
// named in it).
func Each[T any](s Snapshot, t Table, fn func(key string, v *T) error) error {
	for _, r := range s[t] {
		v := new(T)
		if err := Decode(r.Value, v); err != nil {
			return fmt.Errorf("%s record %q: %w", t, r.Key, err)
		}
		if err := fn(r.Key, v); err != nil {
			return err
		}
	}
	return nil
}
