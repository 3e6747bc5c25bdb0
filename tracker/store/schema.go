package store

import (
	"fmt"

	"github.com/kiln-ml/kiln/rpcserver/proto"
)

// Table names a kind of record: a bbolt bucket, an etcd key segment.
type Table uint8

// The tables. The tracker owns the record types of most (they are its
// own); the results table holds proto.Result, with typed accessors below.
const (
	Jobs      Table = iota + 1 // job id → the tracker's job record
	Modules                    // job id → module text (string)
	Artifacts                  // sha256 → the tracker's artifact record
	Leases                     // lease id → the tracker's lease record
	Creds                      // node id → the tracker's node credential
	Meta                       // MetaNextJob → uint64
	Results                    // result id → proto.Result
)

// tables lists every table, for a backend that makes them up front.
var tables = []Table{Jobs, Modules, Artifacts, Leases, Creds, Meta, Results}

func (t Table) String() string {
	switch t {
	case Jobs:
		return "jobs"
	case Modules:
		return "modules"
	case Artifacts:
		return "artifacts"
	case Leases:
		return "leases"
	case Creds:
		return "credentials"
	case Meta:
		return "meta"
	case Results:
		return "results"
	}
	return "unknown"
}

// tableNamed returns the table whose String is name.
func tableNamed(name string) (Table, bool) {
	for _, t := range tables {
		if t.String() == name {
			return t, true
		}
	}
	return 0, false
}

// MetaNextJob is the meta record of the next job number.
const MetaNextJob = "next_job"

// metaWALSeq is the meta record of the last logged batch tracker.db
// holds (bbolt only).
const metaWALSeq = "wal_seq"

// NextJob returns the snapshot's next job number (0 when none is stored).
func (s Snapshot) NextJob() (uint64, error) {
	var n uint64
	if b, ok := s.Value(Meta, MetaNextJob); ok {
		if err := Decode(b, &n); err != nil {
			return 0, fmt.Errorf("next job counter: %w", err)
		}
	}
	return n, nil
}

// PutResult returns the change that stores r under its id.
func PutResult(r *proto.Result) Change { return Put(Results, r.ID, r) }

// DeleteResult returns the change that removes result id.
func DeleteResult(id string) Change { return Delete(Results, id) }

// Results returns the snapshot's results, in id order.
func (s Snapshot) Results() ([]proto.Result, error) {
	out := make([]proto.Result, 0, len(s[Results]))
	err := Each(s, Results, func(_ string, r *proto.Result) error {
		out = append(out, *r)
		return nil
	})
	return out, err
}
