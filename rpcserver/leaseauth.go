package rpcserver

import (
	"context"
	"time"

	"github.com/kiln-ml/kiln/rpcserver/proto"
)

// leaseCheckTimeout bounds the tracker's answer to a hello that carries a
// lease token.
const leaseCheckTimeout = 10 * time.Second

// errFleetToken refuses a hello that carries the fleet token on a daemon
// that takes it for bootstrap only (Config.TokenIsFleet).
var errFleetToken = &proto.TokenRefusal{Reason: "this device opens no session on the fleet token (a secret for joining the fleet): connect with the token of a tracker lease on this device (kiln asks the tracker for one), or start the daemon with --accept-fleet-token"}

// authenticate admits a hello. The fleet token (Config.Token) admits any
// role, as does any token when the daemon has none. A daemon registered
// with a tracker also admits a hello that carries, in place of the fleet
// token, the token of a live lease on this device: a named user then
// needs only their tracker token, and the lease names them. A session's
// call and bulk connections carry the lease token of a session open here.
// The user returned is the lease's user. A daemon whose token is the
// fleet token (Config.TokenIsFleet) refuses it unless AcceptFleetToken.
func (d *Daemon) authenticate(token string, role proto.Role) (string, error) {
	if d.cfg.Token == "" {
		return "", nil
	}
	if proto.TokenEqual(token, d.cfg.Token) {
		if d.cfg.TokenIsFleet && !d.cfg.AcceptFleetToken {
			d.m.refused.Inc("fleet_token")
			return "", errFleetToken
		}
		return "", nil
	}
	if token == "" || d.cfg.Tracker == nil {
		d.m.refused.Inc("token")
		return "", proto.ErrUnauthorized
	}
	if role.Raw() {
		if user, ok := d.leaseSession(token); ok {
			return user, nil
		}
		d.m.refused.Inc("token")
		return "", proto.ErrUnauthorized
	}
	ctx, cancel := context.WithTimeout(context.Background(), leaseCheckTimeout)
	defer cancel()
	li, err := d.cfg.Tracker.VerifyLease(ctx, token)
	if err != nil {
		d.m.refused.Inc("lease")
		d.log.Debug("hello refused: its token is neither the fleet token nor a live lease on this device", "role", role, "err", err)
		return "", proto.ErrUnauthorized
	}
	return li.User, nil
}

// leaseSession reports whether a session open here holds the lease whose
// token is token, and its user.
func (d *Daemon) leaseSession(token string) (string, bool) {
	for _, s := range d.openSessions() {
		s.mu.Lock()
		held, user, live := s.leaseToken, s.user, s.state != stateEnded
		s.mu.Unlock()
		if live && held != "" && proto.TokenEqual(token, held) {
			return user, true
		}
	}
	return "", false
}
