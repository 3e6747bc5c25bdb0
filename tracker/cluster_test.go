package tracker

import (
	"testing"

	"github.com/kiln-ml/kiln/internal/check"
)

// TestReplicaBadInput: a store, a member or a token that cannot make a
// replica is refused at New, naming what is wrong.
func TestReplicaBadInput(t *testing.T) {
	url := etcdURL(t)
	for _, tc := range []struct {
		name  string
		setup func(*Config)
		want  []string
	}{
		{"scheme", func(c *Config) { c.Store = "http://127.0.0.1:2379" }, []string{"want etcd://HOST:PORT"}},
		{"no port", func(c *Config) { c.Store = "etcd://h1:2379,h2" }, []string{`"h2" is not HOST:PORT`}},
		{"unreachable", func(c *Config) { c.Store, c.StoreInsecure = "etcd://127.0.0.1:"+freePort(t), true }, []string{"etcd unreachable at 127.0.0.1:"}},
		{"name not a peer", func(c *Config) { c.Cluster = &ClusterConfig{Name: "z", Peers: "a=http://127.0.0.1:1"} }, []string{`cluster name "z" is not among the cluster peers`}},
		{"peer without URL", func(c *Config) { c.Cluster = &ClusterConfig{Name: "a", Peers: "a=http://127.0.0.1:1,b"} }, []string{`"b" is not NAME=URL`}},
		{"peer twice", func(c *Config) {
			c.Cluster = &ClusterConfig{Name: "a", Peers: "a=http://127.0.0.1:1,a=http://127.0.0.1:2"}
		}, []string{`member "a" is named twice`}},
		{"plain http store", func(c *Config) { c.Store = "etcd://" + url[len("https://"):] }, []string{"plain http", "--store-insecure"}},
		{"http peer", func(c *Config) { c.Cluster = &ClusterConfig{Name: "a", Peers: "a=http://127.0.0.1:1"} }, []string{"cluster peer a's URL http://127.0.0.1:1 is http", "mutual TLS only"}},
		{"http client URL", func(c *Config) {
			c.Cluster = &ClusterConfig{Name: "a", Peers: "a=https://127.0.0.1:1", ClientURL: "http://127.0.0.1:2"}
		}, []string{"cluster client URL http://127.0.0.1:2 is http"}},
		{"client URL a name", func(c *Config) {
			c.Cluster = &ClusterConfig{Name: "a", Peers: "a=https://127.0.0.1:1", ClientURL: "https://etcd.example:2"}
		}, []string{`its host is an IP address`}},
		{"members without a shared secret", func(c *Config) {
			c.Cluster = &ClusterConfig{Name: "a", Peers: "a=https://127.0.0.1:1,b=https://127.0.0.1:2"}
		}, []string{"nothing to authenticate each other with", "--token-file"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := fastConfig(t)
			tc.setup(&cfg)
			_, err := New(cfg)
			check.Error(t, err, tc.want...)
		})
	}

	// The first replica records its token; one with another is refused.
	prefix := etcdPrefix("token")
	first := fastConfig(t)
	etcdStoreConfig(t, &first)
	first.Token = "first-token-0123456789"
	r := &replica{cfg: first, cli: etcdClient(t), prefix: prefix}
	check.NoError(t, r.checkFleet([]string{url}))
	check.NoError(t, r.checkFleet([]string{url}), "the same token again")
	r.cfg.Token = "other-token-0123456789"
	check.Error(t, r.checkFleet([]string{url}), "differs from the one the other replicas", "same --token-file")
}
