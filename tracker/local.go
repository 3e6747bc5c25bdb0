package tracker

import (
	"context"
	"errors"
	"fmt"
	"net"

	"github.com/kiln-ml/kiln/rpcserver/proto"
)

// LocalClient is a client connection to a tracker made in memory by
// DialLocal: the tracker admits it as it admits a network dial with the
// same token, and answers it by the same rules.
type LocalClient struct {
	*proto.Client
	// User is the named user the token admitted; "" for the fleet token
	// (an administrator) or a tracker that checks no token.
	User string
	// Open is true when the tracker checks no token at all.
	Open bool
}

// DialLocal connects to this tracker in memory as a client presenting
// token, through the same hello, authentication and per-user visibility
// as a network connection (the web console reads the fleet this way, so
// a page shows a user exactly what kiln query and kiln results show
// them). On a replica it reaches the tracker of the term this replica
// leads; a replica that follows refuses, naming the leader.
func (s *Server) DialLocal(ctx context.Context, token string) (*LocalClient, error) {
	srv := s
	if s.rep != nil {
		if srv = s.rep.currentTerm(); srv == nil {
			s.rep.mu.Lock()
			leader := s.rep.leader.Kiln
			s.rep.mu.Unlock()
			if leader == "" {
				leader = "not known yet"
			}
			return nil, fmt.Errorf("this tracker replica does not lead now (the leader's kiln address: %s): open the console of the leading replica: %w", leader, proto.ErrUnavailable)
		}
	}
	cli, nc := net.Pipe()
	go srv.rpc.ServeConn(context.Background(), nc)
	c, err := proto.NewClient(ctx, cli, proto.DialOptions{
		Role: proto.RoleClient, Token: token, Expect: proto.ListenerTracker, Logger: srv.log,
	})
	if err != nil {
		cli.Close()
		return nil, err
	}
	lc := &LocalClient{Client: c, Open: srv.cfg.Token == "" && srv.users == nil}
	if srv.users != nil {
		user, err := srv.authenticate(token, proto.RoleClient)
		if err != nil && !errors.Is(err, proto.ErrUnauthorized) {
			c.Close()
			return nil, err
		}
		lc.User = user
	}
	return lc, nil
}
