package store

import (
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"

	"github.com/kiln-ml/kiln/internal/check"
)

// guard bounds every wait in these tests.
const guard = 20 * time.Second

// The tests that need etcd share one single-member embedded etcd,
// started by the first of them and stopped after the last; each works
// under a key prefix of its own.
var testEtcd struct {
	once sync.Once
	e    *embed.Etcd
	url  string
	dir  string
	err  error
	seq  atomic.Int64
}

func TestMain(m *testing.M) {
	code := m.Run()
	if testEtcd.e != nil {
		testEtcd.e.Close()
	}
	if testEtcd.dir != "" {
		os.RemoveAll(testEtcd.dir)
	}
	os.Exit(code)
}

// freePort returns a loopback port free a moment ago.
func freePort(t testing.TB) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	check.NoError(t, err)
	defer ln.Close()
	return strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
}

// etcdURL starts the shared etcd member once and returns its client URL.
func etcdURL(t testing.TB) string {
	t.Helper()
	testEtcd.once.Do(func() {
		dir, err := os.MkdirTemp("", "kiln-tracker-etcd-")
		if err != nil {
			testEtcd.err = err
			return
		}
		testEtcd.dir = dir
		cfg := embed.NewConfig()
		cfg.Name, cfg.Dir, cfg.UnsafeNoFsync = "t", dir, true
		peer, err := url.Parse("http://127.0.0.1:" + freePort(t))
		if err != nil {
			testEtcd.err = err
			return
		}
		client, _ := url.Parse("http://127.0.0.1:" + freePort(t))
		cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{*peer}, []url.URL{*peer}
		cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{*client}, []url.URL{*client}
		cfg.InitialCluster = "t=" + peer.String()
		cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zap.NewNop())
		e, err := embed.StartEtcd(cfg)
		if err != nil {
			testEtcd.err = err
			return
		}
		select {
		case <-e.Server.ReadyNotify():
		case <-time.After(guard):
			e.Close()
			testEtcd.err = fmt.Errorf("etcd not ready within %v", guard)
			return
		}
		testEtcd.e, testEtcd.url = e, client.String()
	})
	check.NoError(t, testEtcd.err, "embedded etcd")
	return testEtcd.url
}

// etcdClient returns a client of the shared etcd member, closed when the
// test ends.
func etcdClient(t testing.TB) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{etcdURL(t)}, DialTimeout: guard, Logger: zap.NewNop()})
	check.NoError(t, err)
	t.Cleanup(func() { cli.Close() })
	return cli
}

// etcdPrefix returns a key prefix no other test uses.
func etcdPrefix(name string) string {
	return fmt.Sprintf("/test/%s-%d/", name, testEtcd.seq.Add(1))
}

// TestEtcdFence: a write guarded by a comparison that no longer holds
// fails, changes nothing, and fences the store for good.
func TestEtcdFence(t *testing.T) {
	cli := etcdClient(t)
	prefix := etcdPrefix("fence")
	ctx := t.Context()
	_, err := cli.Put(ctx, prefix+"leader", "me")
	check.NoError(t, err)
	resp, err := cli.Get(ctx, prefix+"leader")
	check.NoError(t, err)
	rev := resp.Kvs[0].CreateRevision
	st := OpenEtcd(cli, prefix+"s/", []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(prefix+"leader"), "=", rev)}, Hooks{})
	defer st.Close()
	check.NoError(t, st.Wait(st.Apply(Put(Leases, "l-1", leaseRecord{User: "a"}))))
	check.NoError(t, st.Probe(ctx))
	check.NoError(t, st.Ready())

	// Another replica takes over: the key is made again.
	_, err = cli.Delete(ctx, prefix+"leader")
	check.NoError(t, err)
	_, err = cli.Put(ctx, prefix+"leader", "other")
	check.NoError(t, err)
	err = st.Wait(st.Apply(Put(Leases, "l-2", leaseRecord{User: "b"})))
	check.ErrorIs(t, err, ErrFenced)
	select {
	case <-st.Fenced():
	case <-time.After(guard):
		t.Fatal("fenced channel not closed")
	}
	check.ErrorIs(t, st.Ready(), ErrFenced)
	check.ErrorIs(t, st.Wait(st.Apply(Delete(Leases, "l-1"))), ErrFenced)
	snap, err := OpenEtcd(cli, prefix+"s/", nil, Hooks{}).Load()
	check.NoError(t, err)
	ls := leases(t, snap)
	check.Equal(t, len(ls), 1)
	check.Equal(t, ls[0].User, "a")
}
