package tracker

import "github.com/kiln-ml/kiln/rpcserver/proto"

// stateStore is where a tracker keeps what must survive it: build jobs and
// their modules, the next job number, the artifact index, outstanding
// leases and node credentials. The tracker holds its working state in
// memory and tells the store every change, as records keyed within a
// table; nothing about how a store keeps them (transactions, buckets,
// files) reaches the tracker. boltStore (tracker.db) and etcdStore
// implement it.
type stateStore interface {
	// load returns everything stored.
	load() (snapshot, error)
	// apply queues changes to be applied together, after every change
	// queued before them, and returns a 1-buffered channel that receives
	// the result once they are durable. A failed apply changes nothing.
	// Callers queue while holding the tracker's lock, so the store sees
	// changes in the order they happened.
	apply(changes ...change) <-chan error
	// wait returns the result on a channel apply returned; a store may
	// use the wait to apply queued changes in the caller's goroutine.
	wait(done <-chan error) error
	// artifact returns an artifact's index record; ok is false when there
	// is none.
	artifact(sha string) (rec artifactRecord, ok bool, err error)
	// close applies what is queued and closes the store; it is idempotent.
	close() error
}

// table names a kind of record.
type table uint8

const (
	tableJobs      table = iota + 1 // job id → jobRecord
	tableModules                    // job id → module text (string)
	tableArtifacts                  // sha256 → artifactRecord
	tableLeases                     // lease id → leaseRecord
	tableCreds                      // node id → credential
	tableMeta                       // metaNextJob → uint64
	tableResults                    // result id → proto.Result
)

func (t table) String() string {
	switch t {
	case tableJobs:
		return "jobs"
	case tableModules:
		return "modules"
	case tableArtifacts:
		return "artifacts"
	case tableLeases:
		return "leases"
	case tableCreds:
		return "credentials"
	case tableMeta:
		return "meta"
	case tableResults:
		return "results"
	}
	return "unknown"
}

// metaNextJob is the meta record of the next job number.
const metaNextJob = "next_job"

// change is one record written (value set) or deleted (value nil).
type change struct {
	table table
	key   string
	value any
}

func putRecord(t table, key string, v any) change { return change{table: t, key: key, value: v} }
func deleteRecord(t table, key string) change     { return change{table: t, key: key} }

// snapshot is everything a store holds.
type snapshot struct {
	nextJob   uint64
	jobs      []storedJob // in key order
	artifacts map[string]artifactRecord
	leases    []leaseRecord
	creds     []credential
	results   []proto.Result // in key order
}

// storedJob is a job's record and, until it is final, its module.
type storedJob struct {
	rec    jobRecord
	module string
}

// writable returns nil while the store takes writes; otherwise an error
// wrapping proto.ErrUnavailable, which clients take as "try again", so
// that no new lease or build job is accepted that could not be kept.
func (s *Server) writable() error {
	if r, ok := s.st.(readier); ok {
		return r.ready()
	}
	return nil
}
