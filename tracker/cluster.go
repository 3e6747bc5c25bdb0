package tracker

import (
	"cmp"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"

	"github.com/kiln-ml/kiln/internal/metrics"
	"github.com/kiln-ml/kiln/tracker/store"
)

// ClusterConfig runs an embedded etcd member (go.etcd.io/etcd/server/v3/
// embed) in the tracker's process, so that a few trackers form one etcd
// cluster of their own and need no etcd to be run beside them.
type ClusterConfig struct {
	// Name is this member's name among Peers.
	Name string
	// Peers lists every member as NAME=PEER-URL, comma-separated
	// ("a=https://h1:2380,b=https://h2:2380,c=https://h3:2380"): the
	// initial cluster. Each member listens for its peers on its own URL's
	// port (on the URL's address when it is an IP, on every address
	// otherwise). Peer URLs are https: peers speak mutual TLS only.
	Peers string
	// ClientURL is where the member serves etcd clients, this tracker
	// among them (default https://127.0.0.1:2379, an IP address: the
	// member binds it). Only a client with a certificate of the member's
	// own client CA is served (see cluster_tls.go).
	ClientURL string
	// Dir holds the member's data and its TLS files (default DataDir/etcd).
	Dir string
	// CertFile, KeyFile and CAFile, when all are set, authenticate peer
	// traffic (the tracker's --tls-cert, --tls-key, --tls-client-ca);
	// otherwise the peers' CA is derived from the fleet token.
	CertFile, KeyFile, CAFile string

	// noFsync runs the member without fsync (tests only).
	noFsync bool
}

// peerURLs parses Peers into names and URLs, checking that name is among
// them.
func (c *ClusterConfig) peerURLs() (map[string]*url.URL, error) {
	out := map[string]*url.URL{}
	for _, p := range strings.Split(c.Peers, ",") {
		name, raw, ok := strings.Cut(strings.TrimSpace(p), "=")
		if !ok || name == "" || raw == "" {
			return nil, fmt.Errorf("cluster peers %q: %q is not NAME=URL", c.Peers, p)
		}
		u, err := url.Parse(raw)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Port() == "" {
			return nil, fmt.Errorf("cluster peers: %s: %q is not an http(s)://HOST:PORT URL", name, raw)
		}
		if _, dup := out[name]; dup {
			return nil, fmt.Errorf("cluster peers: member %q is named twice", name)
		}
		out[name] = u
	}
	if _, ok := out[c.Name]; !ok {
		return nil, fmt.Errorf("cluster name %q is not among the cluster peers %q", c.Name, c.Peers)
	}
	return out, nil
}

// bindURL is u with its host replaced by 0.0.0.0 when it is not an IP
// address: etcd binds to addresses, not names.
func bindURL(u url.URL) url.URL {
	host := u.Hostname()
	if host != "localhost" && net.ParseIP(host) == nil {
		u.Host = net.JoinHostPort("0.0.0.0", u.Port())
	}
	return u
}

// member is a running embedded etcd member and what the tracker needs to
// reach it.
type member struct {
	*embed.Etcd
	clientURL string
	clientTLS *tls.Config
}

// startMember starts the embedded member, its client and peer URLs over
// mutual TLS (see cluster_tls.go; token is the fleet token, which the
// peers' CA may be derived from), and waits until it has joined its
// cluster (which needs a majority of the members up), for at most wait.
func startMember(c ClusterConfig, dataDir, token string, wait time.Duration, log *slog.Logger) (*member, error) {
	peers, err := c.peerURLs()
	if err != nil {
		return nil, err
	}
	for name, u := range peers {
		if err := checkHTTPS("cluster peer "+name+"'s URL", u.String(), u); err != nil {
			return nil, err
		}
	}
	c.ClientURL = c.clientURL()
	client, err := url.Parse(c.ClientURL)
	if err != nil || client.Port() == "" || (client.Scheme != "http" && client.Scheme != "https") {
		return nil, fmt.Errorf("cluster client URL %q is not an https://IP:PORT URL", c.ClientURL)
	}
	if err := checkHTTPS("cluster client URL", c.ClientURL, client); err != nil {
		return nil, err
	}
	if h := client.Hostname(); h != "localhost" && net.ParseIP(h) == nil {
		return nil, fmt.Errorf("cluster client URL %q: the member binds it, so its host is an IP address (127.0.0.1 unless another is needed), not the name %q", c.ClientURL, h)
	}
	if c.Dir == "" {
		c.Dir = filepath.Join(dataDir, "etcd")
	}
	if err := os.MkdirAll(c.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("embedded etcd member %s: %w", c.Name, err)
	}
	self := peers[c.Name]
	mt, err := c.prepareTLS(c.Dir, self.Hostname(), client.Hostname(), len(peers), token)
	if err != nil {
		return nil, err
	}
	cfg := embed.NewConfig()
	cfg.Name = c.Name
	cfg.Dir = c.Dir
	cfg.InitialCluster = c.Peers
	cfg.InitialClusterToken = "kiln-tracker"
	cfg.AdvertisePeerUrls = []url.URL{*self}
	cfg.ListenPeerUrls = []url.URL{bindURL(*self)}
	cfg.AdvertiseClientUrls = []url.URL{*client}
	cfg.ListenClientUrls = []url.URL{*client}
	cfg.ClientTLSInfo = mt.client
	cfg.PeerTLSInfo = mt.peer
	cfg.UnsafeNoFsync = c.noFsync
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(nopZap)
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, fmt.Errorf("start embedded etcd member %s (peers %s): %w", c.Name, c.Peers, err)
	}
	if log != nil {
		log.Info("embedded etcd member", "name", c.Name, "client", c.ClientURL, "peer", self.String(), "peer_auth", mt.peerAuth)
	}
	select {
	case <-e.Server.ReadyNotify():
		return &member{Etcd: e, clientURL: c.ClientURL, clientTLS: mt.clientCfg}, nil
	case err := <-e.Err():
		e.Close()
		return nil, fmt.Errorf("embedded etcd member %s: %w", c.Name, err)
	case <-time.After(wait):
		e.Server.Stop()
		e.Close()
		return nil, fmt.Errorf("embedded etcd member %s did not join its cluster within %v: are a majority of the members in %s started, with the same --token-file (or certificates from one CA)?", c.Name, wait, c.Peers)
	}
}

// nopZap silences the etcd libraries' own logging: the tracker logs what
// matters of it.
var nopZap = zap.NewNop()

// clientURL is ClientURL or its default.
func (c *ClusterConfig) clientURL() string {
	if c.ClientURL == "" {
		return "https://127.0.0.1:2379"
	}
	return c.ClientURL
}

// memberStartWait is how long a tracker waits for its embedded member to
// join the cluster: the other members' trackers may be started by hand.
const memberStartWait = 5 * time.Minute

// etcdKeyPrefix is where a fleet's keys live in etcd.
const etcdKeyPrefix = "/kiln/tracker/"

// parseEtcdStore reads etcd://HOST:PORT[,HOST:PORT...] into endpoints.
func parseEtcdStore(store string) ([]string, error) {
	rest, ok := strings.CutPrefix(store, "etcd://")
	if !ok || rest == "" {
		return nil, fmt.Errorf("store %q: want etcd://HOST:PORT[,HOST:PORT...]", store)
	}
	var eps []string
	for _, ep := range strings.Split(strings.TrimSuffix(rest, "/"), ",") {
		if _, _, err := net.SplitHostPort(ep); err != nil {
			return nil, fmt.Errorf("store %q: %q is not HOST:PORT", store, ep)
		}
		eps = append(eps, ep)
	}
	return eps, nil
}

// newReplica makes a tracker that runs as one replica of several: it
// starts the embedded etcd member when configured, connects to etcd,
// checks that this replica belongs with the others and binds the
// listeners. The state is loaded when the replica is elected to lead.
func newReplica(cfg Config) (*Server, error) {
	s := &Server{cfg: cfg, log: cfg.Logger, runDone: make(chan struct{})}
	// A follower's /metrics has no tracker state to show: the leader's
	// gauges (build queue depth among them) come only from the leader, so
	// a sum or an average over replicas is not thinned by followers' zeros.
	s.m.reg = metrics.NewRegistry()
	s.m.reg.Flag(leaderMetric, leaderMetricHelp, false)
	s.tvm.init()
	if err := os.MkdirAll(cfg.DataDir, 0o755); err != nil {
		return nil, fmt.Errorf("create tracker data dir: %w", err)
	}
	r := &replica{s: s, cfg: cfg, log: cfg.Logger, prefix: cmp.Or(cfg.etcdPrefix, etcdKeyPrefix), leaseKey: replicaLeaseKey(cfg.Token)}
	var endpoints []string
	var etcdTLS *tls.Config
	if cfg.Cluster != nil {
		m, err := startMember(*cfg.Cluster, cfg.DataDir, cfg.Token, memberStartWait, cfg.Logger)
		if err != nil {
			return nil, err
		}
		r.member = m
		endpoints = []string{m.clientURL}
		etcdTLS = m.clientTLS
	}
	if cfg.Store != "" {
		var err error
		if endpoints, err = parseEtcdStore(cfg.Store); err != nil {
			r.close()
			return nil, err
		}
		etcdTLS = cfg.EtcdTLS
		if etcdTLS == nil {
			if !cfg.StoreInsecure {
				r.close()
				return nil, fmt.Errorf("store %s: etcd over plain http lets anything that reaches it read every lease and rewrite the fleet's state: give the CA of etcd's certificates (--etcd-cacert, with --etcd-cert and --etcd-key for a client certificate), or --store-insecure to accept it", cfg.Store)
			}
			s.log.Warn("the tracker's etcd store is reached over plain http, without authentication (--store-insecure): anything that reaches etcd reads and rewrites the fleet's state", "store", cfg.Store)
		}
	}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints: endpoints, DialTimeout: store.EtcdCallTimeout, TLS: etcdTLS, Logger: nopZap,
		DialKeepAliveTime: 2 * time.Second, DialKeepAliveTimeout: 2 * time.Second,
	})
	if err != nil {
		r.stopMember()
		return nil, fmt.Errorf("etcd %s: %w", strings.Join(endpoints, ","), err)
	}
	r.cli = cli
	if err := r.checkFleet(endpoints); err != nil {
		r.close()
		return nil, err
	}
	if err := s.listen(); err != nil {
		s.closeListeners()
		r.close()
		return nil, err
	}
	if r.self, err = advertised(cfg.Advertise, s.ln, s.tvmLn); err != nil {
		s.closeListeners()
		r.close()
		return nil, err
	}
	r.self.ID = randomID("r-", 6)
	s.rep = r
	return s, nil
}

// checkFleet checks that etcd answers and that the fleet's token is this
// replica's: the first replica records its token's hash, the others
// compare theirs, so that replicas given different tokens do not form
// two fleets that look like one.
func (r *replica) checkFleet(endpoints []string) error {
	key := r.prefix + "token-sha256"
	sum := sha256.Sum256([]byte(r.cfg.Token))
	hash := hex.EncodeToString(sum[:])
	ctx, cancel := context.WithTimeout(context.Background(), store.EtcdCallTimeout)
	defer cancel()
	resp, err := r.cli.Txn(ctx).If(clientv3.Compare(clientv3.Version(key), "=", 0)).
		Then(clientv3.OpPut(key, hash)).Else(clientv3.OpGet(key)).Commit()
	if err != nil {
		return fmt.Errorf("etcd unreachable at %s: %w", strings.Join(endpoints, ","), err)
	}
	if resp.Succeeded {
		return nil
	}
	kvs := resp.Responses[0].GetResponseRange().Kvs
	if len(kvs) == 1 && string(kvs[0].Value) != hash {
		return fmt.Errorf("this tracker's token differs from the one the other replicas on etcd %s use (%s holds another's hash): give every replica the same --token-file", strings.Join(endpoints, ","), key)
	}
	return nil
}

// advertised returns what this replica advertises: adv, or the kiln
// listener's address with the host name when it binds every address, and
// the TVM listener's port on the same host.
func advertised(adv string, ln, tvm net.Listener) (leaderInfo, error) {
	if adv == "" {
		host, port, _ := net.SplitHostPort(ln.Addr().String())
		if ip := net.ParseIP(host); ip == nil || ip.IsUnspecified() {
			h, err := os.Hostname()
			if err != nil {
				return leaderInfo{}, fmt.Errorf("advertise address: %w (set it)", err)
			}
			host = h
		}
		adv = net.JoinHostPort(host, port)
	}
	host, _, err := net.SplitHostPort(adv)
	if err != nil {
		return leaderInfo{}, fmt.Errorf("advertise address %q: %w", adv, err)
	}
	l := leaderInfo{Kiln: adv}
	if tvm != nil {
		_, port, _ := net.SplitHostPort(tvm.Addr().String())
		l.TVM = net.JoinHostPort(host, port)
	}
	return l, nil
}
