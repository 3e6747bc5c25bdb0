package tracker

import (
	"fmt"
	"net"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"

	"github.com/kiln-ml/kiln/internal/check"
)

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
		c := ClusterConfig{
			Name:      "t",
			Peers:     "t=http://127.0.0.1:" + freePort(t),
			ClientURL: "http://127.0.0.1:" + freePort(t),
			Dir:       dir,
			noFsync:   true,
		}
		testEtcd.e, testEtcd.err = startMember(c, dir, guard)
		testEtcd.url = c.ClientURL
	})
	check.NoError(t, testEtcd.err, "embedded etcd")
	return testEtcd.url
}

// etcdClient returns a client of the shared etcd member, closed when the
// test ends.
func etcdClient(t testing.TB) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{etcdURL(t)}, DialTimeout: guard, Logger: nopZap})
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
	ctx := testCtx(t)
	_, err := cli.Put(ctx, prefix+"leader", "me")
	check.NoError(t, err)
	resp, err := cli.Get(ctx, prefix+"leader")
	check.NoError(t, err)
	rev := resp.Kvs[0].CreateRevision
	st := openEtcdStore(cli, prefix+"s/", []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(prefix+"leader"), "=", rev)}, storeHooks{})
	defer st.close()
	check.NoError(t, st.wait(st.apply(putRecord(tableLeases, "l-1", leaseRecord{User: "a"}))))
	check.NoError(t, st.probe(ctx))
	check.NoError(t, st.ready())

	// Another replica takes over: the key is made again.
	_, err = cli.Delete(ctx, prefix+"leader")
	check.NoError(t, err)
	_, err = cli.Put(ctx, prefix+"leader", "other")
	check.NoError(t, err)
	err = st.wait(st.apply(putRecord(tableLeases, "l-2", leaseRecord{User: "b"})))
	check.ErrorIs(t, err, errFenced)
	select {
	case <-st.fencedCh():
	case <-time.After(guard):
		t.Fatal("fenced channel not closed")
	}
	check.ErrorIs(t, st.ready(), errFenced)
	check.ErrorIs(t, st.wait(st.apply(deleteRecord(tableLeases, "l-1"))), errFenced)
	snap, err := openEtcdStore(cli, prefix+"s/", nil, storeHooks{}).load()
	check.NoError(t, err)
	check.Equal(t, len(snap.leases), 1)
	check.Equal(t, snap.leases[0].User, "a")
}
