package tracker

import (
	"fmt"
	"time"

	"github.com/kiln-ml/kiln/rpcserver/proto"
	"github.com/kiln-ml/kiln/tracker/store"
)

// load restores jobs, leases and the artifact index from the store:
// running jobs go back to the queue, expired leases are dropped, and
// artifacts past the store's limit are evicted.
func (s *Server) load() error {
	now := time.Now()
	stored, err := s.st.Load()
	if err != nil {
		return err
	}
	snap, err := decodeSnapshot(stored)
	if err != nil {
		return fmt.Errorf("tracker store: %w", err)
	}
	s.nextJob = snap.nextJob
	var requeue []*job
	var expired []string
	var rehashed []*lease
	for _, sj := range snap.jobs {
		j := &job{BuildJob: sj.rec.Job, queuedAt: sj.rec.QueuedAt, changed: make(chan struct{})}
		if !j.State.Final() {
			// Its module is in the module store, or in the modules
			// table, read back when the job is taken; only an
			// artifact-format job's (a digest) stays in memory.
			j.moduleKey, j.moduleSize = sj.rec.ModuleKey, sj.rec.ModuleSize
			if j.moduleKey == "" && sj.hasModule {
				j.moduleSize = int64(len(sj.module))
				if proto.StoredFormat(j.Format) {
					j.module = sj.module
				} else {
					j.moduleStored = true
				}
			}
		}
		if j.State == proto.JobRunning {
			requeue = append(requeue, j)
		}
		if j.State == proto.JobQueued {
			s.queued = append(s.queued, j)
			if j.CancelOnDisconnect {
				// Its client waits again through the restarted
				// tracker, or the job is cancelled after the grace.
				j.orphaned = now
			}
		}
		s.jobs[j.ID] = j
	}
	for sha, rec := range snap.artifacts {
		s.arti.add(sha, rec)
	}
	s.results.load(snap.results)
	var renewed []store.Change
	for i := range snap.creds {
		c := &snap.creds[i]
		if c.Expires.IsZero() {
			// Written before credentials expired: its life starts now.
			c.Expires = now.Add(s.cfg.CredentialTTL).UTC()
			renewed = append(renewed, store.Put(store.Creds, c.NodeID, c))
		}
		s.creds.add(c)
	}
	if len(renewed) > 0 {
		s.st.Apply(renewed...) // lost, it is done again at the next start
	}
	for _, rec := range snap.leases {
		if now.After(rec.Lease.Expires) {
			expired = append(expired, rec.Lease.ID)
			continue
		}
		l := &lease{Lease: rec.Lease, tokenHash: rec.TokenHash, User: rec.User, Granted: rec.Granted, RequestKey: rec.RequestKey}
		if l.tokenHash == "" {
			// Written when leases were stored with their token in clear:
			// it is hashed, and the record written again without it.
			l.tokenHash = tokenHash(l.Token)
			rehashed = append(rehashed, l)
		}
		s.restoreLeaseToken(l)
		s.leases[l.ID] = l
		s.byToken[l.tokenHash] = l
		if l.RequestKey != "" {
			s.byRequest[idemKey{l.User, l.RequestKey}] = l
		}
	}
	s.mu.Lock()
	s.sortQueueLocked()
	for _, j := range requeue {
		s.requeueLocked(j, "the tracker restarted while it ran", now)
	}
	for _, id := range expired {
		s.deleteLeaseLocked(id)
	}
	for _, l := range rehashed {
		s.persistLeaseLocked(l) // lost, it is done again at the next start
	}
	s.evictLocked("") // the limit may have been lowered since the last run
	var capped []store.Change
	for owner := range s.results.byOwner {
		capped = append(capped, s.capResultsLocked(owner)...)
	}
	if len(capped) > 0 {
		s.st.Apply(capped...)
	}
	s.mu.Unlock()
	if len(s.jobs) > 0 || len(s.leases) > 0 {
		s.log.Info("tracker state restored", "jobs", len(s.jobs), "queued", len(s.queued), "requeued", len(requeue), "leases", len(s.leases))
	}
	return nil
}

// snapshot is the store's content decoded into the tracker's records.
type snapshot struct {
	nextJob   uint64
	jobs      []storedJob // in key order
	artifacts map[string]artifactRecord
	leases    []leaseRecord
	creds     []credential
	results   []proto.Result // in key order
}

// storedJob is a job's record and, until it is final, its module when
// the modules table holds it.
type storedJob struct {
	hasModule bool
	rec       jobRecord
	module    string
}

// decodeSnapshot decodes every table of a store's snapshot with the
// store's codec.
func decodeSnapshot(st store.Snapshot) (snapshot, error) {
	snap := snapshot{artifacts: map[string]artifactRecord{}}
	var err error
	if snap.nextJob, err = st.NextJob(); err != nil {
		return snap, err
	}
	modules := map[string]string{}
	err = store.Each(st, store.Modules, func(id string, m *string) error {
		modules[id] = *m
		return nil
	})
	if err != nil {
		return snap, err
	}
	err = store.Each(st, store.Jobs, func(_ string, rec *jobRecord) error {
		m, ok := modules[rec.Job.ID]
		snap.jobs = append(snap.jobs, storedJob{rec: *rec, module: m, hasModule: ok})
		return nil
	})
	if err != nil {
		return snap, err
	}
	err = store.Each(st, store.Artifacts, func(sha string, rec *artifactRecord) error {
		snap.artifacts[sha] = *rec
		return nil
	})
	if err != nil {
		return snap, err
	}
	err = store.Each(st, store.Leases, func(_ string, rec *leaseRecord) error {
		snap.leases = append(snap.leases, *rec)
		return nil
	})
	if err != nil {
		return snap, err
	}
	err = store.Each(st, store.Creds, func(_ string, c *credential) error {
		snap.creds = append(snap.creds, *c)
		return nil
	})
	if err != nil {
		return snap, err
	}
	snap.results, err = st.Results()
	return snap, err
}

// storedArtifact reads an artifact's index record from the store; ok is
// false when there is none.
func (s *Server) storedArtifact(sha string) (rec artifactRecord, ok bool, err error) {
	b, ok, err := s.st.Get(store.Artifacts, sha)
	if err != nil || !ok {
		return rec, false, err
	}
	if err := store.Decode(b, &rec); err != nil {
		return rec, false, fmt.Errorf("artifact record %s: %w", sha, err)
	}
	return rec, true, nil
}

// writable returns nil while the store takes writes; otherwise an error
// wrapping proto.ErrUnavailable, which clients take as "try again", so
// that no new lease or build job is accepted that could not be kept.
func (s *Server) writable() error { return s.st.Ready() }
