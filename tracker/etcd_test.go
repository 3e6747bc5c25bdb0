package tracker

import (
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/kiln-ml/kiln/internal/check"
)

// The tests that need etcd share one single-member embedded etcd,
// started by the first of them and stopped after the last; each works
// under a key prefix of its own.
var testEtcd struct {
	once sync.Once
	e    *member
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
			Peers:     "t=https://127.0.0.1:" + freePort(t),
			ClientURL: "https://127.0.0.1:" + freePort(t),
			Dir:       dir,
			noFsync:   true,
		}
		testEtcd.e, testEtcd.err = startMember(c, dir, "", guard, nil)
		testEtcd.url = c.ClientURL
	})
	check.NoError(t, testEtcd.err, "embedded etcd")
	return testEtcd.url
}

// etcdClient returns a client of the shared etcd member, closed when the
// test ends.
func etcdClient(t testing.TB) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{etcdURL(t)}, DialTimeout: guard, Logger: nopZap, TLS: testEtcd.e.clientTLS})
	check.NoError(t, err)
	t.Cleanup(func() { cli.Close() })
	return cli
}

// etcdPrefix returns a key prefix no other test uses.
func etcdPrefix(name string) string {
	return fmt.Sprintf("/test/%s-%d/", name, testEtcd.seq.Add(1))
}

// etcdStoreConfig points cfg at the shared etcd member as an external
// store, with the member's client certificate.
func etcdStoreConfig(t testing.TB, cfg *Config) {
	cfg.Store = "etcd://" + strings.TrimPrefix(etcdURL(t), "https://")
	cfg.EtcdTLS = testEtcd.e.clientTLS
	cfg.etcdPrefix = etcdPrefix("replica")
}

// peerPKI writes a CA and a certificate for 127.0.0.1 it signed into a
// directory of the test's, for embedded members' peer traffic, and
// returns a function that sets them in a member's config.
func peerPKI(t testing.TB) func(c *ClusterConfig) {
	t.Helper()
	dir := t.TempDir()
	ca, caFile, err := localCA(dir, "ca", "test peers CA")
	check.NoError(t, err)
	cert, key, err := ca.issueFiles(dir, "peer", "test peer", []string{"127.0.0.1"})
	check.NoError(t, err)
	return func(c *ClusterConfig) { c.CertFile, c.KeyFile, c.CAFile = cert, key, caFile }
}
