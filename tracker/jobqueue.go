package tracker

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/kiln-ml/kiln/rpcserver/proto"
)

// The build queue is one list in hand-out order: interactive jobs before
// bulk ones, within a class the higher priority first, then the older
// (job ids grow with submission, so a requeued job goes back to its old
// place). Reports of queued jobs carry their position and an estimate of
// when they will be built, from the recent jobs' build times.

// jobOrder compares two queued jobs in hand-out order.
func jobOrder(a, b *job) int {
	return cmp.Or(
		cmp.Compare(a.Class.Rank(), b.Class.Rank()),
		cmp.Compare(b.Priority, a.Priority),
		strings.Compare(a.ID, b.ID))
}

// recentBuilds is how many finished jobs' build times the ETA averages.
const recentBuilds = 32

func (s *Server) queueJobLocked(j *job) {
	i, _ := slices.BinarySearchFunc(s.queued, j, jobOrder)
	s.queued = slices.Insert(s.queued, i, j)
	notify(&s.jobAvail)
	s.queueChangedLocked(i + 1)
}

func (s *Server) unqueueJobLocked(j *job) {
	if i := slices.Index(s.queued, j); i >= 0 {
		s.queued = slices.Delete(s.queued, i, i+1)
		s.queueChangedLocked(i)
	}
}

// sortQueueLocked puts the queue in hand-out order (after a load).
func (s *Server) sortQueueLocked() { slices.SortFunc(s.queued, jobOrder) }

// queueChangedLocked wakes the waiters of the queued jobs from index i
// on: their positions changed.
func (s *Server) queueChangedLocked(i int) {
	for _, j := range s.queued[i:] {
		notify(&j.changed)
	}
}

// builtLocked adds the build time of a job that ran to the ETA's window.
func (s *Server) builtLocked(d time.Duration) {
	if len(s.buildTimes) == recentBuilds {
		s.buildTimes = s.buildTimes[1:]
	}
	s.buildTimes = append(s.buildTimes, d)
}

// placeLocked sets a queued job's Position and ETA on its report out.
func (s *Server) placeLocked(out *proto.BuildJob) {
	out.Position, out.ETA = 0, 0
	if out.State != proto.JobQueued {
		return
	}
	if i := slices.IndexFunc(s.queued, func(q *job) bool { return q.ID == out.ID }); i >= 0 {
		s.placeAtLocked(out, i)
	}
}

// placeAtLocked sets the Position and ETA of out, the report of
// s.queued[i].
func (s *Server) placeAtLocked(out *proto.BuildJob, i int) {
	out.Position = i + 1
	if len(s.buildTimes) == 0 {
		return
	}
	var sum time.Duration
	for _, d := range s.buildTimes {
		sum += d
	}
	mean := sum / time.Duration(len(s.buildTimes))
	// The compiler nodes that build the job's target, and the jobs they
	// run: each node builds one job of the queue at a time, in order.
	slots, running := 0, 0
	for _, n := range s.nodes {
		if n.role == proto.NodeCompiler && !n.lost && !n.quarantine && n.attrs.CanBuild(out.Target) {
			slots++
			running += len(n.jobs)
		}
	}
	if slots == 0 {
		return
	}
	ahead := 0
	for _, q := range s.queued[:i] {
		if proto.TargetKind(q.Target) == proto.TargetKind(out.Target) {
			ahead++
		}
	}
	out.ETA = mean * time.Duration(1+(ahead+running)/slots)
}

// checkJobPlace checks a submission's class.
func checkJobPlace(a proto.BuildSubmitArgs) error {
	if a.Class.Rank() > 1 {
		return fmt.Errorf("unknown job class %q (want %q or %q): %w", a.Class, proto.JobInteractive, proto.JobBulk, proto.ErrBadRequest)
	}
	return nil
}

// adoptLocked makes c the connection a cancel-on-disconnect job belongs
// to (it submitted the job, or waits for it).
func adoptLocked(j *job, c *proto.Conn) {
	if j.CancelOnDisconnect && c != nil {
		j.conn, j.orphaned = c, time.Time{}
	}
}

// orphanJobsLocked starts the grace period of the cancel-on-disconnect
// jobs whose connection c closed (one running is cancelled only if it is
// queued again).
func (s *Server) orphanJobsLocked(c *proto.Conn, now time.Time) {
	for _, j := range s.jobs {
		if j.conn == c && !j.State.Final() {
			j.conn, j.orphaned = nil, now
		}
	}
}

// cancelOrphansLocked cancels the queued jobs no connection adopted again
// within the grace period.
func (s *Server) cancelOrphansLocked(now time.Time) {
	var gone []*job
	for _, j := range s.queued {
		if j.CancelOnDisconnect && !j.orphaned.IsZero() && now.Sub(j.orphaned) > s.cfg.JobOrphanGrace {
			gone = append(gone, j)
		}
	}
	for _, j := range gone {
		s.finishJobLocked(j, proto.JobCancelled, fmt.Sprintf("cancelled: the client that submitted it disconnected and did not wait for it again within %s (--job-orphan-grace)", s.cfg.JobOrphanGrace), now)
		s.log.Info("build job cancelled: its client is gone", "job", j.ID)
	}
}
