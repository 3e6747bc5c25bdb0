package tracker

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kiln-ml/kiln/client"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/rpcserver/proto"
)

// TestUserTokens: a named user token admits its user in its own role only,
// the fleet token still admits any role, and revoking the user refuses new
// connections and closes the user's open ones.
func TestUserTokens(t *testing.T) {
	cfg := fastConfig(t)
	cfg.Token = "fleet"
	cfg.UsersFile = filepath.Join(t.TempDir(), "users")
	alice, err := CreateUserToken(cfg.UsersFile, "alice", "client")
	check.NoError(t, err)
	bob, err := CreateUserToken(cfg.UsersFile, "bob", "client")
	check.NoError(t, err)
	st, err := os.Stat(cfg.UsersFile)
	check.NoError(t, err)
	check.Equal(t, st.Mode().Perm(), os.FileMode(0o600))
	text, err := os.ReadFile(cfg.UsersFile)
	check.NoError(t, err)
	check.True(t, !strings.Contains(string(text), alice), "the users file holds a token, not its hash")

	a := startTracker(t, cfg)
	ctx := testCtx(t)
	dial := func(tok string, role proto.Role) (*proto.Client, error) {
		c, err := proto.Dial(ctx, a.Addr(), proto.DialOptions{Role: role, Token: tok, Logger: quietLogger()})
		if err == nil {
			t.Cleanup(func() { c.Close() })
		}
		return c, err
	}

	// Alice as a client: admitted.
	tc, err := client.DialTracker(ctx, a.Addr(), client.TrackerOptions{Token: alice, Logger: quietLogger()})
	check.NoError(t, err)
	defer tc.Close()
	_, err = tc.Query(ctx, 0)
	check.NoError(t, err)

	// Alice as a device or a compiler node: refused, naming the role.
	_, err = dial(alice, proto.RoleDevice)
	check.Error(t, err, `user "alice"`, "role client, not device")
	_, err = dial(alice, proto.RoleCompiler)
	check.Error(t, err, "not compiler")
	// A made-up token: refused as a wrong token.
	_, err = dial("kiln-0000", proto.RoleClient)
	check.ErrorIs(t, err, proto.ErrUnauthorized)
	// The fleet token still takes any role.
	_, err = dial("fleet", proto.RoleDevice)
	check.NoError(t, err)

	// Revoke alice: her open connection is closed, a new one refused; bob
	// is untouched.
	n, err := RevokeUser(cfg.UsersFile, "alice")
	check.NoError(t, err)
	check.Equal(t, n, 1)
	eventually(t, "alice's connection is closed", func() bool {
		_, err := tc.Query(ctx, 0)
		return err != nil
	})
	_, err = dial(alice, proto.RoleClient)
	check.ErrorIs(t, err, proto.ErrUnauthorized)
	_, err = dial(bob, proto.RoleClient)
	check.NoError(t, err)
	_, err = RevokeUser(cfg.UsersFile, "alice")
	check.ErrorIs(t, err, proto.ErrNotFound)
}

// TestUsersFileErrors: a bad users file stops the tracker from starting,
// naming the line; bad names and roles are refused when creating a token.
func TestUsersFileErrors(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad")
	check.NoError(t, os.WriteFile(bad, []byte("# users\nalice client\n"), 0o600))
	cfg := fastConfig(t)
	cfg.Token = "fleet"
	cfg.UsersFile = bad
	_, err := New(cfg)
	check.Error(t, err, "bad:2", "USER ROLE SHA256")
	_, err = CreateUserToken(filepath.Join(dir, "u"), "al ice", "client")
	check.Error(t, err, `"al ice"`)
	_, err = CreateUserToken(filepath.Join(dir, "u"), "alice", "admin")
	check.Error(t, err, `role "admin"`, "takes role client")
}

// TestUsersSeparated: with named user tokens, bob sees alice's job without
// its options and messages and may not cancel it; alice and the fleet token
// see and cancel it; a lease is in the name the token says, not the one the
// client declares.
func TestUsersSeparated(t *testing.T) {
	cfg := fastConfig(t)
	cfg.Token = "fleet"
	cfg.UsersFile = filepath.Join(t.TempDir(), "users")
	aliceTok, err := CreateUserToken(cfg.UsersFile, "alice", "client")
	check.NoError(t, err)
	bobTok, err := CreateUserToken(cfg.UsersFile, "bob", "client")
	check.NoError(t, err)
	a := startTracker(t, cfg)
	ctx := testCtx(t)
	as := func(tok string) *client.Tracker {
		tc, err := client.DialTracker(ctx, a.Addr(), client.TrackerOptions{Token: tok, Logger: quietLogger()})
		check.NoError(t, err)
		t.Cleanup(func() { tc.Close() })
		return tc
	}
	alice, bob, admin := as(aliceTok), as(bobTok), as("fleet")

	j, err := alice.SubmitBuild(ctx, proto.BuildSubmitArgs{Name: "secret.py", Module: module, Target: "cpu", Options: map[string]string{"cflags": "-O3"}})
	check.NoError(t, err)
	check.Equal(t, j.Owner, "alice")

	// Bob: the job without its options; cancelling it is refused.
	got, err := bob.BuildStatus(ctx, j.ID)
	check.NoError(t, err)
	check.Equal(t, len(got.Options), 0)
	sum, err := bob.Query(ctx, 0)
	check.NoError(t, err)
	check.Equal(t, len(sum.Jobs), 1)
	check.Equal(t, len(sum.Jobs[0].Options), 0)
	_, err = bob.CancelBuild(ctx, j.ID)
	check.ErrorIs(t, err, proto.ErrUnauthorized)
	check.Error(t, err, `not user "bob"'s`)

	// Alice and the fleet token see everything.
	got, err = alice.BuildStatus(ctx, j.ID)
	check.NoError(t, err)
	check.Equal(t, got.Options["cflags"], "-O3")
	sum, err = admin.Query(ctx, 0)
	check.NoError(t, err)
	check.Equal(t, sum.Jobs[0].Options["cflags"], "-O3")

	// Alice cancels her own job; bob sees it cancelled, without the message.
	got, err = alice.CancelBuild(ctx, j.ID)
	check.NoError(t, err)
	check.Equal(t, got.State, proto.JobCancelled)
	check.True(t, got.Message+got.Error != "", "alice sees no message")
	got, err = bob.BuildStatus(ctx, j.ID)
	check.NoError(t, err)
	check.Equal(t, got.State, proto.JobCancelled)
	check.Equal(t, got.Message+got.Error, "")

	// A lease is in the token's name, whatever the request says: the
	// device verifying it hears "bob".
	reg := client.NewRegistrar(a.Addr(), client.TrackerOptions{Token: "fleet", Logger: quietLogger()},
		proto.RegisterArgs{Role: proto.NodeDevice, Key: "k", Addr: "127.0.0.1:1"})
	rctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); reg.Run(rctx) }()
	defer func() { stop(); <-done }()
	select {
	case <-reg.Ready():
	case <-time.After(guard):
		t.Fatal("device did not register")
	}
	l, err := bob.RequestLease(ctx, client.LeaseRequest{Key: "k", User: "alice", NoRenew: true})
	check.NoError(t, err)
	info, err := reg.VerifyLease(ctx, l.Token)
	check.NoError(t, err)
	check.Equal(t, info.User, "bob")
}

// TestQueuedJobsPerUser: one named user cannot fill the build queue; the
// refusal names the limit and its flag, and other users still get in.
func TestQueuedJobsPerUser(t *testing.T) {
	cfg := fastConfig(t)
	cfg.Token = "fleet"
	cfg.UsersFile = filepath.Join(t.TempDir(), "users")
	cfg.MaxQueuedJobsPerUser = 2
	aliceTok, err := CreateUserToken(cfg.UsersFile, "alice", "client")
	check.NoError(t, err)
	bobTok, err := CreateUserToken(cfg.UsersFile, "bob", "client")
	check.NoError(t, err)
	a := startTracker(t, cfg)
	ctx := testCtx(t)
	submit := func(tok string, i int) error {
		tc, err := client.DialTracker(ctx, a.Addr(), client.TrackerOptions{Token: tok, Logger: quietLogger()})
		check.NoError(t, err)
		defer tc.Close()
		_, err = tc.SubmitBuild(ctx, proto.BuildSubmitArgs{Module: module + strings.Repeat("#\n", i), Target: "cpu"})
		return err
	}
	check.NoError(t, submit(aliceTok, 1))
	check.NoError(t, submit(aliceTok, 2))
	err = submit(aliceTok, 3)
	check.ErrorIs(t, err, proto.ErrBusy)
	check.Error(t, err, `user "alice" has 2 jobs queued`, "--max-queued-jobs-per-user")
	check.NoError(t, submit(bobTok, 4))
	check.NoError(t, submit("fleet", 5))
}

// TestNodeCredentialsAreNotAdministrators: a node credential acts only for
// its node. A device credential sees other users' jobs as any other user
// does, and cannot cancel them, submit jobs, lease devices in a user's name
// or verify another device's leases; a compiler credential sees whole only
// the job it claimed.
func TestNodeCredentialsAreNotAdministrators(t *testing.T) {
	cfg := identityConfig(t)
	aliceTok, err := CreateUserToken(cfg.UsersFile, "alice", "client")
	check.NoError(t, err)
	a := startTracker(t, cfg)
	addr := a.Addr()
	ctx := testCtx(t)
	alice, err := client.DialTracker(ctx, addr, client.TrackerOptions{Token: aliceTok, Logger: quietLogger()})
	check.NoError(t, err)
	defer alice.Close()
	opts := map[string]string{"cflags": "-O3"}
	first, err := alice.SubmitBuild(ctx, proto.BuildSubmitArgs{Name: "first", Module: module, Target: "cpu", Options: opts})
	check.NoError(t, err)
	second, err := alice.SubmitBuild(ctx, proto.BuildSubmitArgs{Name: "second", Module: module, Target: "cpu", Options: opts})
	check.NoError(t, err)
	board, err := rawDial(t, addr, "fleet", proto.RoleDevice)
	check.NoError(t, err)
	check.NoError(t, board.Call(ctx, proto.MethodTrackerRegister, proto.RegisterArgs{NodeID: "board-1", Role: proto.NodeDevice, Key: "k", Addr: "127.0.0.1:1"}, nil))

	devJoin, _ := newJoinToken(t, cfg.UsersFile, "device")
	devRep, err := join(t, addr, devJoin, proto.RoleDevice, "")
	check.NoError(t, err)
	dev, err := rawDial(t, addr, devRep.Credential, proto.RoleDevice)
	check.NoError(t, err)

	t.Run("device lists and reads jobs", func(t *testing.T) {
		var sum proto.TrackerSummary
		check.NoError(t, dev.Call(ctx, proto.MethodTrackerQuery, proto.QueryArgs{}, &sum))
		check.Equal(t, len(sum.Jobs), 2)
		for _, j := range append(sum.Jobs, sum.BuildQueue...) {
			check.Equal(t, len(j.Options), 0)
		}
		var j proto.BuildJob
		check.NoError(t, dev.Call(ctx, proto.MethodBuildStatus, proto.BuildJobArgs{ID: first.ID}, &j))
		check.Equal(t, len(j.Options), 0)
	})
	t.Run("device cancels a user's job", func(t *testing.T) {
		err := dev.Call(ctx, proto.MethodBuildCancel, proto.BuildJobArgs{ID: first.ID}, nil)
		check.ErrorIs(t, err, proto.ErrUnauthorized)
		check.Error(t, err, `not node "`+devRep.NodeID+`"'s`)
		got, err := alice.BuildStatus(ctx, first.ID)
		check.NoError(t, err)
		check.Equal(t, got.State, proto.JobQueued)
	})
	t.Run("device submits a job", func(t *testing.T) {
		err := dev.Call(ctx, proto.MethodBuildSubmit, proto.BuildSubmitArgs{Module: module, Target: "cpu"}, nil)
		check.ErrorIs(t, err, proto.ErrUnauthorized)
		check.Error(t, err, "submits no build jobs")
	})
	t.Run("device leases in a user's name", func(t *testing.T) {
		err := dev.Call(ctx, proto.MethodLeaseRequest, proto.LeaseRequestArgs{Key: "k", User: "alice"}, nil)
		check.ErrorIs(t, err, proto.ErrUnauthorized)
		check.Error(t, err, "requests no leases")
		check.Equal(t, nodeState(a.Server, "board-1"), proto.StateFree)
	})
	t.Run("device verifies another device's lease", func(t *testing.T) {
		err := dev.Call(ctx, proto.MethodLeaseVerify, proto.LeaseVerifyArgs{NodeID: "board-1", Token: "t"}, nil)
		check.ErrorIs(t, err, proto.ErrUnauthorized)
		check.Error(t, err, "verifies only its own leases")
	})
	t.Run("compiler sees the job it claimed", func(t *testing.T) {
		cmp, cmpNode := joinedCompiler(t, addr, cfg.UsersFile)
		var took proto.BuildTakeReply
		check.NoError(t, cmp.Call(ctx, proto.MethodBuildTake, proto.BuildTakeArgs{NodeID: cmpNode, Wait: time.Second}, &took))
		check.True(t, took.Job != nil && took.Job.ID == first.ID, "the compiler node took no job")
		var mine, other proto.BuildJob
		check.NoError(t, cmp.Call(ctx, proto.MethodBuildStatus, proto.BuildJobArgs{ID: first.ID}, &mine))
		check.Equal(t, mine.Options["cflags"], "-O3")
		check.NoError(t, cmp.Call(ctx, proto.MethodBuildStatus, proto.BuildJobArgs{ID: second.ID}, &other))
		check.Equal(t, len(other.Options), 0)
		err = cmp.Call(ctx, proto.MethodBuildCancel, proto.BuildJobArgs{ID: second.ID}, nil)
		check.ErrorIs(t, err, proto.ErrUnauthorized)
	})
}

// TestUsersFileConcurrentEdits: token commands run at once (as kiln token
// processes on one machine do) each keep their edit: no revocation undone,
// no new token lost.
func TestUsersFileConcurrentEdits(t *testing.T) {
	path := filepath.Join(t.TempDir(), "users")
	const n = 40
	for i := range n {
		_, err := CreateUserToken(path, fmt.Sprintf("old%d", i), "client")
		check.NoError(t, err)
	}
	errs := make(chan error, 3*n)
	for i := range n {
		go func() {
			_, err := RevokeUser(path, fmt.Sprintf("old%d", i))
			errs <- err
		}()
		go func() {
			_, err := CreateUserToken(path, fmt.Sprintf("new%d", i), "client")
			errs <- err
		}()
		go func() {
			_, _, _, err := CreateJoinToken(path, "device", time.Hour, 0)
			errs <- err
		}()
	}
	for range 3 * n {
		check.NoError(t, <-errs)
	}
	entries, err := ListUsersFile(path)
	check.NoError(t, err)
	users, joins := map[string]bool{}, 0
	for _, e := range entries {
		if e.Kind == "join" {
			joins++
		} else {
			users[e.Name] = true
		}
	}
	for i := range n {
		check.True(t, !users[fmt.Sprintf("old%d", i)], "revocation of old%d lost", i)
		check.True(t, users[fmt.Sprintf("new%d", i)], "token of new%d lost", i)
	}
	check.Equal(t, joins, n)
}
