package tracker

import (
	"crypto/hkdf"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// Lease tokens are secrets: whoever holds one opens sessions on its
// device. The store keeps only a token's sha256 (leaseRecord.TokenHash),
// so a copy of tracker.db or of the etcd keys yields none. A tracker makes
// a lease's token from the lease's id with a key of its own, HMAC-SHA256,
// so that one restarted (or a replica taking over) can answer a lease
// request sent again, whose client never had the first answer, with the
// same token: the key is kept beside the store, never in it: a file in
// DataDir for a single tracker; derived from the fleet token, which every
// replica holds, for replicas (a random one when there is no fleet token:
// a request sent again after a failover then gets a fresh token).

// leaseKeyFile is the single tracker's lease-token key, in DataDir.
const leaseKeyFile = "lease-token.key"

// leaseKeyInfo is the HKDF info of the replicas' lease-token key.
const leaseKeyInfo = "kiln lease tokens v1"

// fileLeaseKey reads the key in dataDir, making it at the first start.
func fileLeaseKey(dataDir string) ([]byte, error) {
	path := filepath.Join(dataDir, leaseKeyFile)
	b, err := os.ReadFile(path)
	if err == nil && len(b) == 32 {
		return b, nil
	}
	if err == nil {
		return nil, fmt.Errorf("lease token key %s: %d bytes, want 32 (remove it: a new one is made, and outstanding leases keep working)", path, len(b))
	}
	if !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("lease token key: %w", err)
	}
	key := make([]byte, 32)
	rand.Read(key)
	tmp := path + ".new"
	if err := os.WriteFile(tmp, key, 0o600); err != nil {
		return nil, fmt.Errorf("lease token key: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return nil, fmt.Errorf("lease token key: %w", err)
	}
	return key, nil
}

// replicaLeaseKey is the key every replica given token derives alike.
func replicaLeaseKey(token string) []byte {
	if token == "" {
		key := make([]byte, 32)
		rand.Read(key)
		return key
	}
	key, err := hkdf.Key(sha256.New, []byte(token), nil, leaseKeyInfo, 32)
	if err != nil {
		panic(err) // only for a length HKDF cannot give
	}
	return key
}

// leaseToken is the token of lease id under key: 128 bits, in hex.
func leaseToken(key []byte, id string) string {
	m := hmac.New(sha256.New, key)
	m.Write([]byte("lease " + id))
	return hex.EncodeToString(m.Sum(nil)[:16])
}

// tokenHash is the hex sha256 of a lease token: a token is 128 random
// bits, so its hash stands for it in the store and in lookups without a
// salt or a slow hash.
func tokenHash(token string) string {
	h := sha256.Sum256([]byte(token))
	return hex.EncodeToString(h[:])
}

// tokenIs reports whether token is l's.
func (l *lease) tokenIs(token string) bool {
	return token != "" && subtle.ConstantTimeCompare([]byte(l.tokenHash), []byte(tokenHash(token))) == 1
}

// newLeaseTokenLocked gives l its token, made from its id; one that has a
// token already (whose token this tracker cannot make: its key changed)
// gets a random one instead.
func (s *Server) newLeaseTokenLocked(l *lease) {
	if l.tokenHash != "" && s.byToken[l.tokenHash] == l {
		delete(s.byToken, l.tokenHash)
	}
	if l.tokenHash == "" {
		l.Token = leaseToken(s.leaseKey, l.ID)
	} else {
		l.Token = randomID("", 16)
	}
	l.tokenHash = tokenHash(l.Token)
	s.byToken[l.tokenHash] = l
}

// restoreLeaseToken sets the token of a lease loaded from the store when
// this tracker's key makes it.
func (s *Server) restoreLeaseToken(l *lease) {
	if t := leaseToken(s.leaseKey, l.ID); l.Token == "" && l.tokenIs(t) {
		l.Token = t
	}
}
