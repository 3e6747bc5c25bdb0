package tracker

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/kiln-ml/kiln/rpcserver/proto"
)

func (s *Server) handleQuery(ctx context.Context, c *proto.Conn, a proto.QueryArgs) (any, error) {
	if a.Jobs > proto.MaxQueryJobs {
		return nil, fmt.Errorf("query: %d jobs asked for, over the limit of %d a page (--jobs); page on with --jobs-before: %w",
			a.Jobs, proto.MaxQueryJobs, proto.ErrBadRequest)
	}
	sum := s.summary(a.Jobs, a.JobsBefore)
	for i, j := range sum.BuildQueue {
		sum.BuildQueue[i] = jobFor(c, j)
	}
	for i, j := range sum.Jobs {
		sum.Jobs[i] = jobFor(c, j)
	}
	return sum, nil
}

// Summary returns the tracker's state: devices by key and state, compiler
// nodes, every queue with its waiting requests in order, the most recent
// jobs (up to jobs, the configured default when 0) and TVM servers.
func (s *Server) Summary(jobs int) proto.TrackerSummary { return s.summary(jobs, "") }

// summary is Summary listing the jobs submitted before the job id before
// (all when empty).
func (s *Server) summary(jobs int, before string) proto.TrackerSummary {
	if jobs <= 0 {
		jobs = s.cfg.RecentJobs
	}
	s.mu.Lock()
	sum := proto.TrackerSummary{Now: time.Now(), Leases: len(s.leases), JobCounts: map[proto.JobState]int{}}
	keys := map[string]*proto.KeySummary{}
	key := func(k string) *proto.KeySummary {
		if keys[k] == nil {
			keys[k] = &proto.KeySummary{Key: k}
		}
		return keys[k]
	}
	for _, n := range s.nodes {
		ns := proto.NodeSummary{
			NodeID: n.id, Role: n.role, Key: n.key, Addr: n.addr, State: n.state(), LastSeen: n.lastSeen,
			Failures: len(n.failures), LastError: n.lastErr, Load: n.load, Attrs: n.attrs, Registered: n.registered,
		}
		ns.Lease = strings.Join(n.leaseIDs(), ",")
		for id := range n.jobs {
			ns.Job = id
		}
		if n.role == proto.NodeCompiler {
			sum.Compiler = append(sum.Compiler, ns)
			continue
		}
		sum.Devices = append(sum.Devices, ns)
		ks := key(n.key)
		switch ns.State {
		case proto.StateFree:
			ks.Free++
		case proto.StateBusy:
			ks.Busy++
		case proto.StateLost:
			ks.Lost++
		case proto.StateQuarantined:
			ks.Quarantined++
		}
	}
	for _, q := range s.queues {
		qs := proto.QueueSummary{Queue: q.name}
		for i, t := range q.tickets {
			qs.Waiting = append(qs.Waiting, proto.WaitingTicket{
				Ticket: t.id, Position: i + 1, Priority: t.priority, User: t.user,
				Selector: t.sel.String(), Since: t.since, Deadline: t.deadline,
			})
		}
		sum.Queues = append(sum.Queues, qs)
		if q.key != "" {
			key(q.key).Pending += len(q.tickets)
		}
	}
	all := make([]*job, 0, len(s.jobs))
	for _, j := range s.jobs {
		sum.JobCounts[j.State]++
		if before == "" || j.ID < before {
			all = append(all, j)
		}
	}
	slices.SortFunc(all, func(a, b *job) int { return strings.Compare(b.ID, a.ID) })
	for _, j := range all[:min(jobs, len(all))] {
		out := j.BuildJob
		s.placeLocked(&out)
		sum.Jobs = append(sum.Jobs, out)
	}
	for i, j := range s.queued[:min(len(s.queued), proto.MaxQueryJobs)] {
		out := j.BuildJob
		s.placeAtLocked(&out, i)
		sum.BuildQueue = append(sum.BuildQueue, out)
	}
	if len(all) > jobs {
		sum.MoreJobsBefore = sum.Jobs[len(sum.Jobs)-1].ID
	}
	s.mu.Unlock()
	for _, ks := range keys {
		sum.Keys = append(sum.Keys, *ks)
	}
	slices.SortFunc(sum.Keys, func(a, b proto.KeySummary) int { return strings.Compare(a.Key, b.Key) })
	slices.SortFunc(sum.Devices, func(a, b proto.NodeSummary) int { return strings.Compare(a.Key+a.NodeID, b.Key+b.NodeID) })
	slices.SortFunc(sum.Compiler, func(a, b proto.NodeSummary) int { return strings.Compare(a.NodeID, b.NodeID) })
	slices.SortFunc(sum.Queues, func(a, b proto.QueueSummary) int { return strings.Compare(a.Queue, b.Queue) })
	sum.TVMServers = s.tvm.servers()
	return sum
}
