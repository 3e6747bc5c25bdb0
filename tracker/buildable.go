package tracker

import (
	"fmt"
	"slices"
	"strings"

	"github.com/kiln-ml/kiln/rpcserver/proto"
)

// unbuildableLocked says why no compiler node can build target: nil when a
// registered compiler node (live, or lost but not yet forgotten) builds it,
// or when no compiler node is registered at all (a job then waits for one,
// up to its queue limit). Otherwise the error names what the nodes serve.
func (s *Server) unbuildableLocked(target string) error {
	var serves []string
	any := false
	for _, n := range s.nodes {
		if n.role != proto.NodeCompiler {
			continue
		}
		any = true
		if n.attrs.CanBuild(target) {
			return nil
		}
		for _, t := range n.attrs.Serves() {
			if !slices.Contains(serves, t) {
				serves = append(serves, t)
			}
		}
	}
	if !any {
		return nil
	}
	slices.Sort(serves)
	return fmt.Errorf("no compiler node can build target %q; nodes serve: %s", target, strings.Join(serves, ", "))
}

// noteUnbuildableLocked tells the queued jobs that no registered compiler
// node can build any more (after one left) why they wait: their message,
// seen by query and by the client waiting on them, says so. They stay
// queued, up to their queue limit, so that a node restarting (it
// deregisters, then registers again) costs no job.
func (s *Server) noteUnbuildableLocked() {
	for _, j := range s.queued {
		err := s.unbuildableLocked(j.Target)
		if err == nil {
			continue
		}
		msg := "waiting: " + err.Error()
		if j.Message != msg {
			j.Message = msg
			j.Seq++
			notify(&j.changed)
		}
	}
}
