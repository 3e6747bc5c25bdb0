package tracker

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kiln-ml/kiln/client"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/rpcserver/proto"
	"github.com/kiln-ml/kiln/tracker/store"
)

// fleetSecrets joins a device with a join token, registers it with the
// credential it gets, leases it, and returns the join token, the
// credential and the lease token, with the registrar and the lease.
func fleetSecrets(t *testing.T, addr, usersFile string) ([]string, *client.Registrar, *client.Lease) {
	t.Helper()
	tok, _ := newJoinToken(t, usersFile, "device")
	credFile := filepath.Join(t.TempDir(), "node.cred")
	r, _, _ := joined(t, addr, tok, credFile)
	select {
	case <-r.Ready():
	case <-time.After(guard):
		t.Fatal("device did not join and register")
	}
	var cred struct {
		Credential string `json:"credential"`
	}
	b, err := os.ReadFile(credFile)
	check.NoError(t, err)
	check.NoError(t, json.Unmarshal(b, &cred))
	tc, err := client.DialTracker(testCtx(t), addr, client.TrackerOptions{Token: "fleet", Logger: quietLogger()})
	check.NoError(t, err)
	t.Cleanup(func() { tc.Close() })
	l, err := tc.RequestLease(testCtx(t), client.LeaseRequest{Key: "board", NoRenew: true, TTL: time.Hour})
	check.NoError(t, err)
	_, err = r.VerifyLease(testCtx(t), l.Token)
	check.NoError(t, err)
	return []string{tok, cred.Credential, l.Token}, r, l
}

// noSecretIn fails when dump holds any of secrets.
func noSecretIn(t *testing.T, what string, dump []byte, secrets []string) {
	t.Helper()
	check.True(t, len(dump) > 0, what, "is empty")
	for _, s := range secrets {
		check.True(t, len(s) >= 16, "a short secret", s)
		check.True(t, !bytes.Contains(dump, []byte(s)), what, "holds a secret in clear:", s[:8]+"…")
	}
}

// TestStoreHoldsNoSecrets: a lease token, a node credential and a join
// token in use leave no copy in clear in tracker.db, its write-ahead log
// or etcd's keys, and the lease still verifies and renews by its token
// after a restart (or with a new term's leader).
func TestStoreHoldsNoSecrets(t *testing.T) {
	t.Run("bbolt", func(t *testing.T) {
		cfg := identityConfig(t)
		a := startTracker(t, cfg)
		secrets, _, l := fleetSecrets(t, a.Addr(), cfg.UsersFile)
		a.stop(t)
		var all []byte
		for _, f := range []string{"tracker.db", "tracker.db.wal"} {
			b, err := os.ReadFile(filepath.Join(cfg.DataDir, f))
			check.NoError(t, err)
			noSecretIn(t, f, b, secrets)
			all = append(all, b...)
		}
		check.True(t, bytes.Contains(all, []byte(l.ID)), "the lease was not stored")

		cfg.Listen = a.Addr()
		b := startTracker(t, cfg)
		c, err := rawDial(t, b.Addr(), "fleet", proto.RoleClient)
		check.NoError(t, err)
		var renewed proto.Lease
		check.NoError(t, c.Call(testCtx(t), proto.MethodLeaseRenew, proto.LeaseRenewArgs{ID: l.ID, Token: l.Token}, &renewed))
		check.Equal(t, renewed.Token, l.Token)
		err = c.Call(testCtx(t), proto.MethodLeaseRenew, proto.LeaseRenewArgs{ID: l.ID, Token: tokenHash(l.Token)}, nil)
		check.ErrorIs(t, err, proto.ErrSessionExpired) // the stored hash is no token
	})
	t.Run("etcd", func(t *testing.T) {
		cfg := identityConfig(t)
		etcdStoreConfig(t, &cfg)
		cfg.ElectionTTL = time.Second
		r := startTracker(t, cfg)
		eventually(t, "the replica leads", func() bool { return r.rep.currentTerm() != nil && r.Ready() == nil })
		secrets, _, _ := fleetSecrets(t, r.Addr(), cfg.UsersFile)
		resp, err := etcdClient(t).Get(testCtx(t), "", clientv3.WithPrefix()) // every key, not only this fleet's
		check.NoError(t, err)
		var dump bytes.Buffer
		for _, kv := range resp.Kvs {
			dump.Write(kv.Key)
			dump.Write(kv.Value)
		}
		check.True(t, bytes.Contains(dump.Bytes(), []byte(cfg.etcdPrefix+"state/leases/")), "no lease was stored")
		noSecretIn(t, "etcd", dump.Bytes(), secrets)
	})
}

// TestLeaseTokenMigration: a lease stored with its token in clear (as
// trackers before hashed tokens stored it) still renews by that token,
// and is stored again with its hash only.
func TestLeaseTokenMigration(t *testing.T) {
	cfg := fastConfig(t)
	path := filepath.Join(cfg.DataDir, "tracker.db")
	st, err := store.OpenBolt(path, store.Hooks{})
	check.NoError(t, err)
	const legacy = "0123456789abcdef0123456789abcdef"
	old := leaseRecord{Lease: proto.Lease{ID: "l-old", Token: legacy, NodeID: "device-x", Key: "k", Expires: time.Now().Add(time.Hour), TTL: time.Hour}, User: "alice", Granted: time.Now()}
	check.NoError(t, st.Wait(st.Apply(store.Put(store.Leases, "l-old", old))))
	check.NoError(t, st.Close())

	a := startTracker(t, cfg)
	c, err := rawDial(t, a.Addr(), "", proto.RoleClient)
	check.NoError(t, err)
	var renewed proto.Lease
	check.NoError(t, c.Call(testCtx(t), proto.MethodLeaseRenew, proto.LeaseRenewArgs{ID: "l-old", Token: legacy}, &renewed))
	check.Equal(t, renewed.Token, legacy)
	a.stop(t)

	st, err = store.OpenBolt(path, store.Hooks{})
	check.NoError(t, err)
	defer st.Close()
	snap, err := st.Load()
	check.NoError(t, err)
	var recs []leaseRecord
	check.NoError(t, store.Each(snap, store.Leases, func(_ string, l *leaseRecord) error {
		recs = append(recs, *l)
		return nil
	}))
	check.Equal(t, len(recs), 1)
	check.Equal(t, recs[0].Lease.Token, "")
	check.Equal(t, recs[0].TokenHash, tokenHash(legacy))
}

// TestEmbeddedEtcdMutualTLS: the embedded member serves only clients
// with a certificate of its own CA: a plain http client, and a TLS client
// that trusts the member but has no certificate, can neither read nor
// write (the election key among others) on its client URL, nor reach its
// peer URL; the tracker's own client can. Its TLS files are its user's
// only.
func TestEmbeddedEtcdMutualTLS(t *testing.T) {
	dir := t.TempDir()
	peerPort, clientPort := freePort(t), freePort(t)
	c := ClusterConfig{
		Name: "solo", Peers: "solo=https://127.0.0.1:" + peerPort,
		ClientURL: "https://127.0.0.1:" + clientPort, Dir: dir, noFsync: true,
	}
	m, err := startMember(c, "", "", guard, nil)
	check.NoError(t, err)
	defer m.Close()
	ctx := testCtx(t)
	key := etcdKeyPrefix + "election/attacker"

	// The tracker's own client: served.
	own, err := clientv3.New(clientv3.Config{Endpoints: []string{m.clientURL}, TLS: m.clientTLS, DialTimeout: guard, Logger: nopZap})
	check.NoError(t, err)
	defer own.Close()
	_, err = own.Put(ctx, etcdKeyPrefix+"probe", "1")
	check.NoError(t, err)

	// A plain client: refused (the attempt ends at its deadline).
	plain, err := clientv3.New(clientv3.Config{Endpoints: []string{"http://127.0.0.1:" + clientPort}, DialTimeout: time.Second, Logger: nopZap})
	check.NoError(t, err)
	defer plain.Close()
	short, cancel := context.WithTimeout(ctx, 2*time.Second)
	_, err = plain.Put(short, key, `{"id":"r-evil","kiln":"127.0.0.1:1"}`)
	cancel()
	check.True(t, err != nil, "a plain client wrote the election key")
	resp, err := http.Post("http://127.0.0.1:"+clientPort+"/v3/kv/range", "application/json", strings.NewReader(`{"key":"L2tpbG4v","range_end":"L2tpbG4w"}`))
	if err == nil {
		body := new(bytes.Buffer)
		body.ReadFrom(resp.Body)
		resp.Body.Close()
		check.True(t, resp.StatusCode != http.StatusOK && !strings.Contains(body.String(), "kvs"), "a plain http request read the store:", resp.Status, body.String())
	}

	// A TLS client without a certificate: refused at the handshake, on
	// the client URL and on the peer URL.
	pool := x509.NewCertPool()
	for _, f := range []string{"client-ca.crt", "peer-ca.crt"} {
		pem, err := os.ReadFile(filepath.Join(dir, tlsDir, f))
		check.NoError(t, err)
		check.True(t, pool.AppendCertsFromPEM(pem), f)
	}
	noCert := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}, Timeout: guard}
	for _, u := range []string{"https://127.0.0.1:" + clientPort + "/v3/kv/range", "https://127.0.0.1:" + peerPort + "/members"} {
		resp, err := noCert.Post(u, "application/json", strings.NewReader(`{"key":"L2tpbG4v","range_end":"L2tpbG4w"}`))
		if err == nil {
			resp.Body.Close()
		}
		check.True(t, err != nil, "a client without a certificate was served at", u)
	}
	// With the member's peer certificate, the peer URL answers: the
	// refusal above is the missing certificate's.
	pair, err := tls.LoadX509KeyPair(filepath.Join(dir, tlsDir, "peer.crt"), filepath.Join(dir, tlsDir, "peer.key"))
	check.NoError(t, err)
	withCert := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{pair}}}, Timeout: guard}
	resp, err = withCert.Get("https://127.0.0.1:" + peerPort + "/members")
	check.NoError(t, err)
	resp.Body.Close()
	check.Equal(t, resp.StatusCode, http.StatusOK)

	got, err := own.Get(ctx, key)
	check.NoError(t, err)
	check.Equal(t, len(got.Kvs), 0)

	st, err := os.Stat(filepath.Join(dir, tlsDir))
	check.NoError(t, err)
	check.Equal(t, st.Mode().Perm(), os.FileMode(0o700))
	for _, f := range []string{"client-ca.key", "client.key", "client-server.key", "peer.key"} {
		st, err := os.Stat(filepath.Join(dir, tlsDir, f))
		check.NoError(t, err)
		check.Equal(t, st.Mode().Perm(), os.FileMode(0o600), f)
	}
}
