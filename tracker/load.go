package tracker

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/vmihailenco/msgpack/v5"
	bolt "go.etcd.io/bbolt"

	"github.com/kiln-ml/kiln/rpcserver/proto"
)

// load restores jobs, leases and the artifact index from the store:
// running jobs go back to the queue, expired leases are dropped, and
// artifacts past the store's limit are evicted.
func (s *Server) load() error {
	now := time.Now()
	var requeue []*job
	var expired []string
	err := s.st.view(func(tx *bolt.Tx) error {
		if b := tx.Bucket(bucketMeta).Get(keyNextJob); b != nil {
			if err := msgpack.Unmarshal(b, &s.nextJob); err != nil {
				return fmt.Errorf("next job counter: %w", err)
			}
		}
		modules := tx.Bucket(bucketModules)
		err := tx.Bucket(bucketJobs).ForEach(func(k, v []byte) error {
			var rec jobRecord
			if err := msgpack.Unmarshal(v, &rec); err != nil {
				return fmt.Errorf("job %s: %w", k, err)
			}
			j := &job{BuildJob: rec.Job, queuedAt: rec.QueuedAt, changed: make(chan struct{})}
			if !j.State.Final() {
				j.module = string(modules.Get(k))
			}
			if j.State == proto.JobRunning {
				requeue = append(requeue, j)
			}
			if j.State == proto.JobQueued {
				s.queued = append(s.queued, j)
			}
			s.jobs[j.ID] = j
			return nil
		})
		if err != nil {
			return err
		}
		err = tx.Bucket(bucketArtifacts).ForEach(func(k, v []byte) error {
			var rec artifactRecord
			if err := msgpack.Unmarshal(v, &rec); err != nil {
				return fmt.Errorf("artifact %s: %w", k, err)
			}
			s.arti.add(string(k), rec)
			return nil
		})
		if err != nil {
			return err
		}
		err = tx.Bucket(bucketCreds).ForEach(func(k, v []byte) error {
			var c credential
			if err := msgpack.Unmarshal(v, &c); err != nil {
				return fmt.Errorf("credential of node %s: %w", k, err)
			}
			s.creds.add(&c)
			return nil
		})
		if err != nil {
			return err
		}
		return tx.Bucket(bucketLeases).ForEach(func(k, v []byte) error {
			var rec leaseRecord
			if err := msgpack.Unmarshal(v, &rec); err != nil {
				return fmt.Errorf("lease %s: %w", k, err)
			}
			if now.After(rec.Lease.Expires) {
				expired = append(expired, string(k))
				return nil
			}
			l := &lease{Lease: rec.Lease, User: rec.User, Granted: rec.Granted}
			s.leases[l.ID] = l
			s.byToken[l.Token] = l
			return nil
		})
	})
	if err != nil {
		return err
	}
	slices.SortFunc(s.queued, func(a, b *job) int { return strings.Compare(a.ID, b.ID) })
	s.mu.Lock()
	for _, j := range requeue {
		s.requeueLocked(j, "the tracker restarted while it ran", now)
	}
	for _, id := range expired {
		s.deleteLeaseLocked(id)
	}
	s.evictLocked("") // the limit may have been lowered since the last run
	s.mu.Unlock()
	if len(s.jobs) > 0 || len(s.leases) > 0 {
		s.log.Info("tracker state restored", "jobs", len(s.jobs), "queued", len(s.queued), "requeued", len(requeue), "leases", len(s.leases))
	}
	return nil
}
