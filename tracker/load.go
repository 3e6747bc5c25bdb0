package tracker

import (
	"time"

	"github.com/kiln-ml/kiln/rpcserver/proto"
)

// load restores jobs, leases and the artifact index from the store:
// running jobs go back to the queue, expired leases are dropped, and
// artifacts past the store's limit are evicted.
func (s *Server) load() error {
	now := time.Now()
	snap, err := s.st.load()
	if err != nil {
		return err
	}
	s.nextJob = snap.nextJob
	var requeue []*job
	var expired []string
	for _, sj := range snap.jobs {
		j := &job{BuildJob: sj.rec.Job, queuedAt: sj.rec.QueuedAt, changed: make(chan struct{})}
		if !j.State.Final() {
			j.module = sj.module
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
	var renewed []change
	for i := range snap.creds {
		c := &snap.creds[i]
		if c.Expires.IsZero() {
			// Written before credentials expired: its life starts now.
			c.Expires = now.Add(s.cfg.CredentialTTL).UTC()
			renewed = append(renewed, putRecord(tableCreds, c.NodeID, c))
		}
		s.creds.add(c)
	}
	if len(renewed) > 0 {
		s.st.apply(renewed...) // lost, it is done again at the next start
	}
	for _, rec := range snap.leases {
		if now.After(rec.Lease.Expires) {
			expired = append(expired, rec.Lease.ID)
			continue
		}
		l := &lease{Lease: rec.Lease, User: rec.User, Granted: rec.Granted, RequestKey: rec.RequestKey}
		s.leases[l.ID] = l
		s.byToken[l.Token] = l
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
	s.evictLocked("") // the limit may have been lowered since the last run
	var capped []change
	for owner := range s.results.byOwner {
		capped = append(capped, s.capResultsLocked(owner)...)
	}
	if len(capped) > 0 {
		s.st.apply(capped...)
	}
	s.mu.Unlock()
	if len(s.jobs) > 0 || len(s.leases) > 0 {
		s.log.Info("tracker state restored", "jobs", len(s.jobs), "queued", len(s.queued), "requeued", len(requeue), "leases", len(s.leases))
	}
	return nil
}
