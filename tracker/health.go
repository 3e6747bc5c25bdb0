package tracker

import "errors"

// Ready returns nil while the tracker can take requests: it is not
// stopping and its store is reachable. The metrics listener's /readyz
// answers with it, so a load balancer or Kubernetes sends no new work to
// a tracker that could not keep it.
func (s *Server) Ready() error {
	s.mu.Lock()
	stopping := s.stopping
	s.mu.Unlock()
	if stopping {
		return errors.New("tracker is stopping")
	}
	if s.rep != nil {
		return s.rep.ready()
	}
	return s.st.Ready()
}
