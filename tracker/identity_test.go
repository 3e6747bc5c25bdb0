package tracker

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kiln-ml/kiln/client"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/rpcserver/proto"
	"github.com/kiln-ml/kiln/tracker/store"
)

// identityConfig is a tracker config with a fleet token and a users file.
func identityConfig(t *testing.T) Config {
	cfg := fastConfig(t)
	cfg.Token = "fleet"
	cfg.UsersFile = filepath.Join(t.TempDir(), "users")
	check.NoError(t, os.WriteFile(cfg.UsersFile, nil, 0o600))
	return cfg
}

func newJoinToken(t *testing.T, path, role string) (tok, id string) {
	t.Helper()
	tok, id, _, err := CreateJoinToken(path, role, time.Hour, 0)
	check.NoError(t, err)
	return tok, id
}

// rawDial dials addr with token in role; the connection is closed when the
// test ends.
func rawDial(t *testing.T, addr, token string, role proto.Role) (*proto.Client, error) {
	t.Helper()
	c, err := proto.Dial(testCtx(t), addr, proto.DialOptions{Role: role, Token: token, Logger: quietLogger()})
	if err == nil {
		t.Cleanup(func() { c.Close() })
	}
	return c, err
}

// join exchanges a join token for a credential over a raw connection.
func join(t *testing.T, addr, token string, role proto.Role, nodeID string) (proto.JoinReply, error) {
	t.Helper()
	c, err := rawDial(t, addr, token, role)
	if err != nil {
		return proto.JoinReply{}, err
	}
	var rep proto.JoinReply
	err = c.Call(testCtx(t), proto.MethodTrackerJoin, proto.JoinArgs{NodeID: nodeID}, &rep)
	return rep, err
}

// joinedCompiler joins a compiler node building cpu with a new compiler
// join token and registers it over a raw connection with its credential.
func joinedCompiler(t *testing.T, addr, usersFile string) (*proto.Client, string) {
	t.Helper()
	tok, _ := newJoinToken(t, usersFile, "compiler")
	rep, err := join(t, addr, tok, proto.RoleCompiler, "")
	check.NoError(t, err)
	c, err := rawDial(t, addr, rep.Credential, proto.RoleCompiler)
	check.NoError(t, err)
	args := proto.RegisterArgs{Role: proto.NodeCompiler, Attrs: proto.NodeAttrs{Targets: []string{"cpu"}, Compiler: "gcc 12"}}
	check.NoError(t, c.Call(testCtx(t), proto.MethodTrackerRegister, args, nil))
	return c, rep.NodeID
}

// joined runs a device Registrar that joins with tok and keeps its
// credential in credFile, until the returned stop is called.
func joined(t *testing.T, addr, tok, credFile string) (*client.Registrar, <-chan error, context.CancelFunc) {
	t.Helper()
	r := client.NewRegistrar(addr, client.TrackerOptions{Token: tok, CredentialFile: credFile, Logger: quietLogger()},
		proto.RegisterArgs{Role: proto.NodeDevice, Key: "board", Addr: "127.0.0.1:1"})
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- r.Run(ctx) }()
	t.Cleanup(cancel)
	return r, errc, cancel
}

// TestJoinToken: a device joins with a join token, stores its credential
// (0600) and registers under the node id the credential is bound to; after
// the join token is gone, and after a tracker restart, the stored
// credential alone brings the node back under the same id.
func TestJoinToken(t *testing.T) {
	cfg := identityConfig(t)
	a := startTracker(t, cfg)
	tok, id := newJoinToken(t, cfg.UsersFile, "device")
	check.True(t, strings.HasPrefix(tok, JoinTokenPrefix) && client.IsJoinToken(tok), tok)
	text, err := os.ReadFile(cfg.UsersFile)
	check.NoError(t, err)
	check.True(t, !strings.Contains(string(text), tok), "the users file holds the join token's hash, not the token")

	credFile := filepath.Join(t.TempDir(), "state", "node.cred")
	r, _, stop := joined(t, a.Addr(), tok, credFile)
	select {
	case <-r.Ready():
	case <-time.After(guard):
		t.Fatal("device did not join and register")
	}
	node := r.NodeID()
	check.True(t, strings.HasPrefix(node, "device-"), node)
	check.Equal(t, nodeState(a.Server, node), proto.StateFree)
	st, err := os.Stat(credFile)
	check.NoError(t, err)
	check.Equal(t, st.Mode().Perm(), os.FileMode(0o600))
	var stored struct {
		NodeID     string `json:"node_id"`
		Role       string `json:"role"`
		Credential string `json:"credential"`
	}
	b, err := os.ReadFile(credFile)
	check.NoError(t, err)
	check.NoError(t, json.Unmarshal(b, &stored))
	check.Equal(t, stored.NodeID, node)
	check.Equal(t, stored.Role, "device")
	check.True(t, strings.HasPrefix(stored.Credential, CredentialPrefix), stored.Credential)
	stop()

	// The join token is removed: the credential still admits the node.
	check.NoError(t, RevokeJoin(cfg.UsersFile, id))
	check.ErrorIs(t, RevokeJoin(cfg.UsersFile, id), proto.ErrNotFound)
	a.stop(t)
	cfg.Listen = a.Addr()
	b2 := startTracker(t, cfg)
	_, err = rawDial(t, b2.Addr(), tok, proto.RoleDevice)
	check.ErrorIs(t, err, proto.ErrUnauthorized)
	r2, _, _ := joined(t, b2.Addr(), tok, credFile)
	select {
	case <-r2.Ready():
	case <-time.After(guard):
		t.Fatal("device did not register with its stored credential after a restart")
	}
	check.Equal(t, r2.NodeID(), node)
}

// TestIdentityAttacks performs each attack a node or user identity must
// not allow, and checks the error says why.
func TestIdentityAttacks(t *testing.T) {
	cfg := identityConfig(t)
	a := startTracker(t, cfg)
	addr := a.Addr()
	ctx := testCtx(t)
	devJoin, _ := newJoinToken(t, cfg.UsersFile, "device")
	cmpJoin, _ := newJoinToken(t, cfg.UsersFile, "compiler")
	dev, err := join(t, addr, devJoin, proto.RoleDevice, "")
	check.NoError(t, err)
	check.Equal(t, dev.Role, proto.RoleDevice)
	cmp, err := join(t, addr, cmpJoin, proto.RoleCompiler, "")
	check.NoError(t, err)
	check.True(t, strings.HasPrefix(cmp.NodeID, "compiler-"), cmp.NodeID)

	t.Run("join token in another role", func(t *testing.T) {
		_, err := rawDial(t, addr, devJoin, proto.RoleCompiler)
		check.Error(t, err, "is for role device, not compiler")
		_, err = rawDial(t, addr, devJoin, proto.RoleClient)
		check.Error(t, err, "not client")
	})
	t.Run("join token used for anything but joining", func(t *testing.T) {
		c, err := rawDial(t, addr, devJoin, proto.RoleDevice)
		check.NoError(t, err)
		err = c.Call(ctx, proto.MethodTrackerRegister, proto.RegisterArgs{Role: proto.NodeDevice, Key: "k", Addr: "127.0.0.1:1"}, nil)
		check.ErrorIs(t, err, proto.ErrUnauthorized)
		check.Error(t, err, "may only call tracker.join")
		err = c.Call(ctx, proto.MethodTrackerQuery, proto.QueryArgs{}, nil)
		check.Error(t, err, "may only call tracker.join")
		err = c.Upload(ctx, proto.BulkArtifactUpload, strings.Repeat("0", 64), 3, strings.NewReader("abc"))
		check.Error(t, err, "may only call tracker.join")
	})
	t.Run("expired join token", func(t *testing.T) {
		old, oldHash := newSecret(JoinTokenPrefix)
		check.NoError(t, appendUsersLine(cfg.UsersFile, "@join jold device "+oldHash+" 2020-01-01T00:00:00Z"))
		eventually(t, "the tracker reads the expired join token", func() bool {
			_, err := rawDial(t, addr, old, proto.RoleDevice)
			return err != nil && strings.Contains(err.Error(), "join token jold expired at 2020-01-01T00:00:00Z")
		})
	})
	t.Run("device credential claims a build job", func(t *testing.T) {
		// As a compiler: refused at the hello, the role is the credential's.
		_, err := rawDial(t, addr, dev.Credential, proto.RoleCompiler)
		check.Error(t, err, "credential of node "+`"`+dev.NodeID+`"`, "is for role device, not compiler")
		// On its own device connection: build.take is for compiler nodes.
		c, err := rawDial(t, addr, dev.Credential, proto.RoleDevice)
		check.NoError(t, err)
		tc, err := client.DialTracker(ctx, addr, client.TrackerOptions{Token: "fleet", Logger: quietLogger()})
		check.NoError(t, err)
		defer tc.Close()
		_, err = tc.SubmitBuild(ctx, proto.BuildSubmitArgs{Name: "victim", Module: module, Target: "cpu"})
		check.NoError(t, err)
		err = c.Call(ctx, proto.MethodBuildTake, proto.BuildTakeArgs{NodeID: dev.NodeID}, nil)
		check.Error(t, err, "only compiler nodes may")
	})
	t.Run("compiler credential registers a device", func(t *testing.T) {
		_, err := rawDial(t, addr, cmp.Credential, proto.RoleDevice)
		check.Error(t, err, "is for role compiler, not device")
		c, err := rawDial(t, addr, cmp.Credential, proto.RoleCompiler)
		check.NoError(t, err)
		err = c.Call(ctx, proto.MethodTrackerRegister, proto.RegisterArgs{Role: proto.NodeDevice, Key: "k", Addr: "127.0.0.1:1"}, nil)
		check.Error(t, err, "want device on a device connection")
		check.Equal(t, len(a.Summary(0).Devices), 0)
	})
	t.Run("credential registers under another node's id", func(t *testing.T) {
		c, err := rawDial(t, addr, dev.Credential, proto.RoleDevice)
		check.NoError(t, err)
		err = c.Call(ctx, proto.MethodTrackerRegister, proto.RegisterArgs{NodeID: "someone-else", Role: proto.NodeDevice, Key: "k", Addr: "127.0.0.1:1"}, nil)
		check.ErrorIs(t, err, proto.ErrUnauthorized)
		check.Error(t, err, `credential is for node "`+dev.NodeID+`", not "someone-else"`)
		var rep proto.RegisterReply
		check.NoError(t, c.Call(ctx, proto.MethodTrackerRegister, proto.RegisterArgs{Role: proto.NodeDevice, Key: "k", Addr: "127.0.0.1:1"}, &rep))
		check.Equal(t, rep.NodeID, dev.NodeID)
	})
	t.Run("a credential or user token cannot join", func(t *testing.T) {
		c, err := rawDial(t, addr, dev.Credential, proto.RoleDevice)
		check.NoError(t, err)
		err = c.Call(ctx, proto.MethodTrackerJoin, proto.JoinArgs{}, nil)
		check.Error(t, err, "only a connection admitted with a join token may join")
	})
	t.Run("user token registers", func(t *testing.T) {
		alice, err := CreateUserToken(cfg.UsersFile, "alice", "client")
		check.NoError(t, err)
		eventually(t, "the tracker reads alice's token", func() bool {
			_, err := rawDial(t, addr, alice, proto.RoleClient)
			return err == nil
		})
		_, err = rawDial(t, addr, alice, proto.RoleDevice)
		check.Error(t, err, `user "alice"`, "registers nothing")
		_, err = CreateUserToken(cfg.UsersFile, "board-7", "device")
		check.Error(t, err, "for clients only", "kiln token create --role device --ttl 1h")
	})
	t.Run("revoked credential", func(t *testing.T) {
		credFile := filepath.Join(t.TempDir(), "cred")
		r, errc, _ := joined(t, addr, devJoin, credFile)
		select {
		case <-r.Ready():
		case <-time.After(guard):
			t.Fatal("device did not join")
		}
		node := r.NodeID()
		held, err := rawDial(t, addr, mustCred(t, credFile), proto.RoleDevice)
		check.NoError(t, err)
		check.NoError(t, RevokeNode(cfg.UsersFile, node))
		// Its open connections are closed and the registrar gives up,
		// naming the file to remove; a new hello is refused.
		select {
		case err := <-errc:
			check.Error(t, err, "was revoked at", credFile)
		case <-time.After(guard):
			t.Fatal("the revoked node's registrar did not stop")
		}
		select {
		case <-held.Done():
		case <-time.After(guard):
			t.Fatal("the revoked credential's connection stays open")
		}
		_, err = rawDial(t, addr, mustCred(t, credFile), proto.RoleDevice)
		check.Error(t, err, "was revoked at")
		eventually(t, "the revoked node is lost", func() bool { return nodeState(a.Server, node) == proto.StateLost })
		// Other nodes are untouched.
		_, err = rawDial(t, addr, dev.Credential, proto.RoleDevice)
		check.NoError(t, err)
		// With a join token it joins again, as a new node.
		rep, err := join(t, addr, devJoin, proto.RoleDevice, node)
		check.NoError(t, err)
		check.True(t, rep.NodeID != node, rep.NodeID)
		_, err = rawDial(t, addr, rep.Credential, proto.RoleDevice)
		check.NoError(t, err)
	})
	t.Run("registrar with a join token and no credential file", func(t *testing.T) {
		r := client.NewRegistrar(addr, client.TrackerOptions{Token: devJoin, Logger: quietLogger()},
			proto.RegisterArgs{Role: proto.NodeDevice, Key: "board", Addr: "127.0.0.1:1"})
		err := r.Run(ctx)
		check.Error(t, err, "--credential-file")
	})
}

// TestJoinCannotClaimAnID performs the takeover of a node's id with a join
// token: the attacker asks to join as a live device and as the compiler
// node, waits for the device's connection to drop and registers as it at
// an address of its own, so that clients' leases (and their lease-token
// hellos) would go to it. The tracker assigns join ids, the credential
// binds them, and a dropped connection does not free an id to another
// address until the lost window has passed.
func TestJoinCannotClaimAnID(t *testing.T) {
	cfg := identityConfig(t)
	a := startTracker(t, cfg)
	addr := a.Addr()
	ctx := testCtx(t)
	register := func(c *proto.Client, id, at string) error {
		return c.Call(ctx, proto.MethodTrackerRegister, proto.RegisterArgs{NodeID: id, Role: proto.NodeDevice, Key: "board", Addr: at}, nil)
	}
	victim, err := rawDial(t, addr, "fleet", proto.RoleDevice)
	check.NoError(t, err)
	check.NoError(t, register(victim, "board-1", "127.0.0.1:7001"))
	builder, err := rawDial(t, addr, "fleet", proto.RoleCompiler)
	check.NoError(t, err)
	check.NoError(t, builder.Call(ctx, proto.MethodTrackerRegister, proto.RegisterArgs{NodeID: "builder-1", Role: proto.NodeCompiler, Addr: "127.0.0.1:0"}, nil))

	devJoin, _ := newJoinToken(t, cfg.UsersFile, "device")
	for _, id := range []string{"board-1", "builder-1"} {
		rep, err := join(t, addr, devJoin, proto.RoleDevice, id)
		check.NoError(t, err)
		check.True(t, rep.NodeID != id && strings.HasPrefix(rep.NodeID, "device-"), rep.NodeID)
	}
	rep, err := join(t, addr, devJoin, proto.RoleDevice, "board-1")
	check.NoError(t, err)

	// The victim's connection drops; the attacker registers as it.
	victim.Close()
	eventually(t, "the victim is lost", func() bool { return nodeState(a.Server, "board-1") == proto.StateLost })
	evil, err := rawDial(t, addr, rep.Credential, proto.RoleDevice)
	check.NoError(t, err)
	err = register(evil, "board-1", "127.0.0.1:6666")
	check.ErrorIs(t, err, proto.ErrUnauthorized)
	check.Error(t, err, "credential is for node")

	// Even a fleet-token registration from another address waits out the
	// lost window; the node itself, where it ran, comes back at once.
	other, err := rawDial(t, addr, "fleet", proto.RoleDevice)
	check.NoError(t, err)
	err = register(other, "board-1", "127.0.0.1:6666")
	check.ErrorIs(t, err, proto.ErrBusy)
	check.Error(t, err, `node "board-1" was seen`, "refused until it has been silent for 1s")
	back, err := rawDial(t, addr, "fleet", proto.RoleDevice)
	check.NoError(t, err)
	check.NoError(t, register(back, "board-1", "127.0.0.1:7001"))
	check.Equal(t, nodeState(a.Server, "board-1"), proto.StateFree)
	for _, n := range a.Summary(0).Devices {
		if n.NodeID == "board-1" {
			check.Equal(t, n.Addr, "127.0.0.1:7001")
		}
	}
}

func mustCred(t *testing.T, path string) string {
	t.Helper()
	var c struct{ Credential string }
	b, err := os.ReadFile(path)
	check.NoError(t, err)
	check.NoError(t, json.Unmarshal(b, &c))
	return c.Credential
}

// TestUsersFileLines: join and revocation lines are checked like user
// lines, naming the line and what is wrong.
func TestUsersFileLines(t *testing.T) {
	h := strings.Repeat("ab", 32)
	for _, tc := range []struct{ line, want string }{
		{"@join j1 device " + h, "want @join ID ROLE SHA256 EXPIRES"},
		{"@join j1 client " + h + " 2030-01-01T00:00:00Z", "a join token takes role device or compiler"},
		{"@join j1 device xyz 2030-01-01T00:00:00Z", "not a sha256"},
		{"@join j1 device " + h + " tomorrow", "want RFC 3339"},
		{"@join ../x device " + h + " 2030-01-01T00:00:00Z", "join token id"},
		{"@revoked n1", "want @revoked NODE-ID SINCE"},
		{"@revoked n1 yesterday", "revocation time"},
		{"bob device " + h, "for clients only"},
	} {
		_, err := parseUsers("u", []byte("# ok\n"+tc.line+"\n"))
		check.Error(t, err, "u:2", tc.want)
	}
	m, err := parseUsers("u", []byte("@join j1 compiler "+h+" 2030-01-01T00:00:00Z\n@revoked n1 2026-01-01T00:00:00.5Z\n@revoked n1 2025-01-01T00:00:00Z\n"))
	check.NoError(t, err)
	check.Equal(t, m.joins[h].role, proto.RoleCompiler)
	check.Equal(t, m.revoked["n1"], time.Date(2026, 1, 1, 0, 0, 0, 5e8, time.UTC))
	// Creating a join token drops the expired ones.
	u := filepath.Join(t.TempDir(), "u")
	check.NoError(t, os.WriteFile(u, []byte("@join jold device "+h+" 2020-01-01T00:00:00Z\nalice client "+h+"\n"), 0o600))
	_, id, _, err := CreateJoinToken(u, "device", time.Hour, 0)
	check.NoError(t, err)
	text, err := os.ReadFile(u)
	check.NoError(t, err)
	check.True(t, !strings.Contains(string(text), "jold") && strings.Contains(string(text), "alice client") && strings.Contains(string(text), "@join "+id+" device"), string(text))
	_, _, _, err = CreateJoinToken(filepath.Join(t.TempDir(), "u"), "device", 30*24*time.Hour, 0)
	check.Error(t, err, "at most 168h")
	_, _, _, err = CreateJoinToken(filepath.Join(t.TempDir(), "u"), "client", time.Hour, 0)
	check.Error(t, err, "device or compiler")
}

// FuzzParseUsers: no users file text makes the parser panic, and what it
// accepts holds only well-formed entries.
func FuzzParseUsers(f *testing.F) {
	h := strings.Repeat("0f", 32)
	f.Add([]byte("alice client " + h + "\n"))
	f.Add([]byte("@join j1 device " + h + " 2030-01-01T00:00:00Z\n@revoked device-1 2026-01-01T00:00:00Z\n# c\n"))
	f.Add([]byte("@join\n@revoked\n\n"))
	f.Fuzz(func(t *testing.T, text []byte) {
		m, err := parseUsers("u", text)
		if err != nil {
			return
		}
		for hash, u := range m.byHash {
			if !isSHA256(hash) || !userName.MatchString(u.user) || u.role != proto.RoleClient {
				t.Fatalf("accepted a bad user line: %q %+v", hash, u)
			}
		}
		for hash, j := range m.joins {
			if !isSHA256(hash) || !userName.MatchString(j.id) || (j.role != proto.RoleDevice && j.role != proto.RoleCompiler) {
				t.Fatalf("accepted a bad join line: %q %+v", hash, j)
			}
		}
	})
}

// TestJoinTokenMaxUses: a join token admits at most its max uses, however
// many nodes race to join with it, and is refused at the hello once used
// up; a token without a limit (an older line) still admits nodes.
func TestJoinTokenMaxUses(t *testing.T) {
	cfg := identityConfig(t)
	tok, hash := newSecret(JoinTokenPrefix)
	exp := time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	check.NoError(t, appendUsersLine(cfg.UsersFile, "@join j3 compiler "+hash+" "+exp+" 3"))
	old, oldHash := newSecret(JoinTokenPrefix)
	check.NoError(t, appendUsersLine(cfg.UsersFile, "@join jold device "+oldHash+" "+exp))
	a := startTracker(t, cfg)

	const racers = 12
	errs := make(chan error, racers)
	for range racers {
		go func() {
			_, err := join(t, a.Addr(), tok, proto.RoleCompiler, "")
			errs <- err
		}()
	}
	joined, refused := 0, 0
	for range racers {
		switch err := <-errs; {
		case err == nil:
			joined++
		case strings.Contains(err.Error(), "join token j3 has admitted 3 node(s), its limit"):
			refused++
		default:
			t.Fatalf("join: %v", err)
		}
	}
	check.Equal(t, joined, 3)
	check.Equal(t, refused, racers-3)
	_, err := rawDial(t, a.Addr(), tok, proto.RoleCompiler)
	check.Error(t, err, "its limit (kiln token create --max-uses)")
	for range 4 {
		_, err := join(t, a.Addr(), old, proto.RoleDevice, "")
		check.NoError(t, err)
	}
	// The uses count across a restart: they are the credentials minted.
	a.stop(t)
	cfg.Listen = a.Addr()
	b := startTracker(t, cfg)
	_, err = join(t, b.Addr(), tok, proto.RoleCompiler, "")
	check.Error(t, err, "has admitted 3 node(s)")
}

// TestCredentialExpires: a credential left unused past the credential TTL
// is refused and its node must join again; one whose node keeps its
// heartbeat is renewed and keeps working. A credential stored before
// credentials expired still admits its node.
func TestCredentialExpires(t *testing.T) {
	// A credential stored without an expiry loads, and admits its node.
	cfg := identityConfig(t)
	legacy, legacyHash := newSecret(CredentialPrefix)
	st, err := store.OpenBolt(filepath.Join(cfg.DataDir, "tracker.db"), store.Hooks{})
	check.NoError(t, err)
	check.NoError(t, st.Wait(st.Apply(store.Put(store.Creds, "device-old", &credential{NodeID: "device-old", Role: proto.RoleDevice, Hash: legacyHash, Issued: time.Now().Add(-time.Hour)}))))
	check.NoError(t, st.Close())
	old := startTracker(t, cfg)
	_, err = rawDial(t, old.Addr(), legacy, proto.RoleDevice)
	check.NoError(t, err)
	old.stop(t)

	cfg = identityConfig(t)
	cfg.CredentialTTL = time.Second
	a := startTracker(t, cfg)
	tok, _ := newJoinToken(t, cfg.UsersFile, "device")
	idle, err := join(t, a.Addr(), tok, proto.RoleDevice, "")
	check.NoError(t, err)
	credFile := filepath.Join(t.TempDir(), "cred")
	r, _, _ := joined(t, a.Addr(), tok, credFile)
	select {
	case <-r.Ready():
	case <-time.After(guard):
		t.Fatal("device did not join")
	}
	// Each use renews a credential: leave this one alone for its life.
	unused := time.Now().Add(cfg.CredentialTTL)
	eventually(t, "the idle credential's life to pass", func() bool { return time.Now().After(unused) })
	_, err = rawDial(t, a.Addr(), idle.Credential, proto.RoleDevice)
	check.Error(t, err, `the credential of node "`+idle.NodeID+`" expired, unused for 1s`, "join again")
	check.Equal(t, nodeState(a.Server, r.NodeID()), proto.StateFree)
	_, err = rawDial(t, a.Addr(), mustCred(t, credFile), proto.RoleDevice)
	check.NoError(t, err)
}
