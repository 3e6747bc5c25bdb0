package tracker

import (
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/client"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/rpcserver/proto"
)

// usersFleet starts a tracker with cfg (identityConfig's) and returns a
// function that dials it with a named user's token.
func usersFleet(t *testing.T, cfg Config, names ...string) (*running, func(name string) *client.Tracker) {
	t.Helper()
	toks := map[string]string{}
	for _, n := range names {
		tok, err := CreateUserToken(cfg.UsersFile, n, "client")
		check.NoError(t, err)
		toks[n] = tok
	}
	a := startTracker(t, cfg)
	return a, func(name string) *client.Tracker {
		tc, err := client.DialTracker(testCtx(t), a.Addr(), client.TrackerOptions{Token: toks[name], Logger: quietLogger()})
		check.NoError(t, err)
		t.Cleanup(func() { tc.Close() })
		return tc
	}
}

// TestQueueSharePerUser performs the attack of one user filling the
// build queue's byte budget: their jobs past their share are refused
// naming --max-queued-bytes-per-user, and another user's job of the same
// size is still accepted.
func TestQueueSharePerUser(t *testing.T) {
	cfg := identityConfig(t)
	cfg.MaxQueuedBytes = 1 << 20
	cfg.MaxQueuedBytesPerUser = 400 << 10
	_, as := usersFleet(t, cfg, "alice", "bob")
	ctx := testCtx(t)
	alice, bob := as("alice"), as("bob")
	big := "# " + strings.Repeat("x", 150<<10) + "\n" + module
	var err error
	accepted := 0
	for range 10 {
		if _, err = alice.SubmitBuild(ctx, proto.BuildSubmitArgs{Module: big, Target: "cpu"}); err != nil {
			break
		}
		accepted++
	}
	check.ErrorIs(t, err, proto.ErrBusy)
	check.Error(t, err, `user "alice"`, "--max-queued-bytes-per-user")
	check.Equal(t, accepted, 2)
	_, err = bob.SubmitBuild(ctx, proto.BuildSubmitArgs{Module: big, Target: "cpu"})
	check.NoError(t, err, "bob's job after alice filled her share")
}

// TestArtifactSharesPerUser performs the attack of one user's uploads
// evicting another's artifacts: alice uploads far past her share, which
// evicts her own least recently used ones and never bob's; an upload
// larger than a share is refused naming its flag.
func TestArtifactSharesPerUser(t *testing.T) {
	cfg := identityConfig(t)
	cfg.MaxArtifactBytes = 4000
	cfg.MaxArtifactBytesPerUser = 2000
	_, as := usersFleet(t, cfg, "alice", "bob")
	alice, bob := as("alice"), as("bob")
	b, bobs := blob('b', 800)
	check.NoError(t, upload(t, bob, b, bobs))
	var alices []string
	for i := range 8 {
		a, sha := blob(byte('A'+i), 600)
		check.NoError(t, upload(t, alice, a, sha), "alice's upload", i)
		alices = append(alices, sha)
	}
	check.NoError(t, download(t, bob, bobs), "bob's artifact after alice's uploads")
	for _, sha := range alices[len(alices)-3:] {
		check.NoError(t, download(t, alice, sha), "one of alice's newest")
	}
	eventually(t, "alice's oldest is evicted", func() bool {
		return errors.Is(download(t, alice, alices[0]), proto.ErrNotFound)
	})
	huge, sha := blob('h', 2500)
	err := upload(t, alice, huge, sha)
	check.ErrorIs(t, err, proto.ErrTooLarge)
	check.Error(t, err, "--max-artifact-bytes-per-user")
}

// TestUploadInFlightCounts: an upload counts against its owner's share
// from its first byte: while one of alice's stalls half sent, another
// that would pass her share is refused at once (not spooled), bob's goes
// through, and the stalled one completes once its bytes come.
func TestUploadInFlightCounts(t *testing.T) {
	cfg := identityConfig(t)
	cfg.MaxArtifactBytes = 4000
	cfg.MaxArtifactBytesPerUser = 2000
	a, as := usersFleet(t, cfg, "alice", "bob")
	alice, alice2, bob := as("alice"), as("alice"), as("bob")
	slow, slowSHA := blob('s', 1500)
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() { done <- alice.UploadArtifact(testCtx(t), slowSHA, int64(len(slow)), pr) }()
	_, err := pw.Write(slow[:100])
	check.NoError(t, err)
	eventually(t, "the stalled upload is in flight", func() bool {
		a.mu.Lock()
		defer a.mu.Unlock()
		return a.arti.inflightBy["alice"] == 1500
	})

	more, moreSHA := blob('m', 1000)
	err = upload(t, alice2, more, moreSHA)
	check.ErrorIs(t, err, proto.ErrBusy)
	check.Error(t, err, "in flight", "--max-artifact-bytes-per-user")
	b, bobs := blob('b', 1000)
	check.NoError(t, upload(t, bob, b, bobs), "bob's upload beside alice's stalled one")

	_, err = pw.Write(slow[100:])
	check.NoError(t, err)
	check.NoError(t, <-done, "the stalled upload, completed")
	check.NoError(t, download(t, alice2, slowSHA))
	rest, restSHA := blob('r', 500)
	check.NoError(t, upload(t, alice2, rest, restSHA), "within the share once the first is stored")
}
