package tracker

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/kiln-ml/kiln/rpcserver/proto"
	"github.com/kiln-ml/kiln/tracker/store"
)

// resultIndex is the results store as the tracker holds it, guarded by
// Server.mu: every result by id, and each owner's ids oldest first, for
// the cap that keeps an owner's newest MaxResultsPerUser.
type resultIndex struct {
	byID    map[string]*proto.Result
	byOwner map[string][]string
}

func (x *resultIndex) add(r *proto.Result) {
	if x.byID == nil {
		x.byID = map[string]*proto.Result{}
		x.byOwner = map[string][]string{}
	}
	x.byID[r.ID] = r
	x.byOwner[r.Owner] = append(x.byOwner[r.Owner], r.ID)
}

// older orders results by when they were recorded, then by id.
func older(a, b *proto.Result) int {
	if c := a.Recorded.Compare(b.Recorded); c != 0 {
		return c
	}
	return strings.Compare(a.ID, b.ID)
}

// loadResults indexes the stored results, each owner's oldest first.
func (x *resultIndex) load(rs []proto.Result) {
	for i := range rs {
		x.add(&rs[i])
	}
	for owner, ids := range x.byOwner {
		slices.SortFunc(ids, func(a, b string) int { return older(x.byID[a], x.byID[b]) })
		x.byOwner[owner] = ids
	}
}

// capLocked drops owner's oldest results past MaxResultsPerUser and
// returns their deletions.
func (s *Server) capResultsLocked(owner string) []store.Change {
	ids := s.results.byOwner[owner]
	over := len(ids) - s.cfg.MaxResultsPerUser
	if over <= 0 {
		return nil
	}
	dels := make([]store.Change, over)
	for i, id := range ids[:over] {
		delete(s.results.byID, id)
		dels[i] = store.DeleteResult(id)
	}
	s.results.byOwner[owner] = slices.Clone(ids[over:])
	s.log.Info("results evicted", "owner", owner, "count", over, "limit", s.cfg.MaxResultsPerUser)
	return dels
}

// mayRecord refuses a connection that is not a client's (nodes do not
// record timings).
func mayRecord(c *proto.Conn) error {
	if c.Role() != proto.RoleClient {
		return fmt.Errorf("record result: role %s may not record results: %w", c.Role(), proto.ErrUnauthorized)
	}
	return nil
}

// resultVisible reports whether the peer on c may see r: its owner, any
// user when it is shared, and an administrator (the fleet token) always.
func resultVisible(c *proto.Conn, r *proto.Result) bool {
	if kind, _ := identity(c); kind == "admin" {
		return true
	}
	u := userOf(c)
	return r.Shared || (u != "" && u == r.Owner)
}

// checkResult refuses a result that is empty or over the limits.
func checkResult(r *proto.Result) error {
	switch {
	case r.Function == "":
		return fmt.Errorf("record result: no function: %w", proto.ErrBadRequest)
	case len(r.Time.Results) == 0:
		return fmt.Errorf("record result of %q: no timings: %w", r.Function, proto.ErrBadRequest)
	case len(r.Label) > proto.MaxResultLabel:
		return fmt.Errorf("record result: label of %d bytes, at most %d: %w", len(r.Label), proto.MaxResultLabel, proto.ErrTooLarge)
	case len(r.Time.Results) > proto.MaxResultSamples:
		return fmt.Errorf("record result: %d samples, at most %d: %w", len(r.Time.Results), proto.MaxResultSamples, proto.ErrTooLarge)
	case len(r.Kernels) > proto.MaxResultKernels:
		return fmt.Errorf("record result: %d kernels, at most %d: %w", len(r.Kernels), proto.MaxResultKernels, proto.ErrTooLarge)
	case len(r.Inputs) > proto.MaxResultInputs:
		return fmt.Errorf("record result: %d inputs, at most %d: %w", len(r.Inputs), proto.MaxResultInputs, proto.ErrTooLarge)
	}
	for _, k := range r.Kernels {
		if len(k.Results) > proto.MaxResultSamples {
			return fmt.Errorf("record result: kernel %q has %d samples, at most %d: %w", k.Name, len(k.Results), proto.MaxResultSamples, proto.ErrTooLarge)
		}
		if len(k.Ops) > proto.MaxKernelOps {
			return fmt.Errorf("record result: kernel %q names %d model operators, at most %d: %w", k.Name, len(k.Ops), proto.MaxKernelOps, proto.ErrTooLarge)
		}
	}
	return nil
}

// handleResultRecord stores a result owned by the connection's user,
// durable before it is answered, and evicts the user's oldest past the cap.
func (s *Server) handleResultRecord(ctx context.Context, c *proto.Conn, a proto.ResultRecordArgs) (any, error) {
	if err := mayRecord(c); err != nil {
		return nil, err
	}
	r := a.Result
	if err := checkResult(&r); err != nil {
		return nil, err
	}
	if err := s.writable(); err != nil {
		return nil, fmt.Errorf("record result: %w", err)
	}
	r.Owner = userOf(c)
	r.Recorded = time.Now().UTC()
	r.ID = randomID("r-", 8)
	s.mu.Lock()
	s.results.add(&r)
	changes := append([]store.Change{store.PutResult(&r)}, s.capResultsLocked(r.Owner)...)
	durable := s.st.Apply(changes...)
	s.mu.Unlock()
	if err := s.st.Wait(durable); err != nil {
		s.mu.Lock()
		s.dropResultLocked(r.ID)
		s.mu.Unlock()
		return nil, fmt.Errorf("record result: %w", err)
	}
	return r, nil
}

// dropResultLocked forgets a result whose write failed.
func (s *Server) dropResultLocked(id string) {
	r := s.results.byID[id]
	if r == nil {
		return
	}
	delete(s.results.byID, id)
	ids := s.results.byOwner[r.Owner]
	if i := slices.Index(ids, id); i >= 0 {
		s.results.byOwner[r.Owner] = slices.Delete(slices.Clone(ids), i, i+1)
	}
}

// resultMatches reports whether r passes a list's filters.
func resultMatches(r *proto.Result, a proto.ResultListArgs) bool {
	switch {
	case a.Function != "" && r.Function != a.Function,
		a.DeviceKey != "" && r.DeviceKey != a.DeviceKey,
		a.Label != "" && r.Label != a.Label,
		a.Owner != "" && r.Owner != a.Owner,
		a.Source != "" && r.Source != a.Source,
		!a.Since.IsZero() && r.Recorded.Before(a.Since):
		return false
	}
	if len(a.Attrs) > 0 {
		flat := r.DeviceAttrs.Flatten()
		for k, v := range a.Attrs {
			if flat[k] != v {
				return false
			}
		}
	}
	return true
}

// defaultResultList is how many results a list answers without a limit.
const defaultResultList = 1000

func (s *Server) handleResultList(ctx context.Context, c *proto.Conn, a proto.ResultListArgs) (any, error) {
	if a.Limit <= 0 || a.Limit > defaultResultList {
		a.Limit = defaultResultList
	}
	var out proto.ResultList
	s.mu.Lock()
	var hits []*proto.Result
	for _, r := range s.results.byID {
		if resultVisible(c, r) && resultMatches(r, a) {
			hits = append(hits, r)
		}
	}
	slices.SortFunc(hits, func(a, b *proto.Result) int { return older(b, a) })
	out.Total = len(hits)
	for _, r := range hits[:min(len(hits), a.Limit)] {
		out.Results = append(out.Results, *r)
	}
	s.mu.Unlock()
	return out, nil
}

func (s *Server) handleResultGet(ctx context.Context, c *proto.Conn, a proto.ResultGetArgs) (any, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.results.byID[a.ID]
	if r == nil || !resultVisible(c, r) {
		return nil, fmt.Errorf("result %q: %w", a.ID, proto.ErrNotFound)
	}
	return *r, nil
}
