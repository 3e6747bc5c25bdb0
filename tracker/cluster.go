package tracker

import (
	"fmt"
	"net"
	"net/url"
	"path/filepath"
	"strings"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
)

// ClusterConfig runs an embedded etcd member (go.etcd.io/etcd/server/v3/
// embed) in the tracker's process, so that a few trackers form one etcd
// cluster of their own and need no etcd to be run beside them.
type ClusterConfig struct {
	// Name is this member's name among Peers.
	Name string
	// Peers lists every member as NAME=PEER-URL, comma-separated
	// ("a=http://h1:2380,b=http://h2:2380,c=http://h3:2380"): the
	// initial cluster. Each member listens for its peers on its own URL's
	// port (on the URL's address when it is an IP, on every address
	// otherwise).
	Peers string
	// ClientURL is where the member serves etcd clients, this tracker
	// among them (default http://127.0.0.1:2379).
	ClientURL string
	// Dir holds the member's data (default DataDir/etcd).
	Dir string
	// CertFile, KeyFile and CAFile, when set, secure peer traffic with
	// mutual TLS (peer URLs then use https).
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

// startMember starts the embedded member and waits until it has joined
// its cluster (which needs a majority of the members up), for at most
// wait.
func startMember(c ClusterConfig, dataDir string, wait time.Duration) (*embed.Etcd, error) {
	peers, err := c.peerURLs()
	if err != nil {
		return nil, err
	}
	if c.ClientURL == "" {
		c.ClientURL = "http://127.0.0.1:2379"
	}
	client, err := url.Parse(c.ClientURL)
	if err != nil || client.Port() == "" {
		return nil, fmt.Errorf("cluster client URL %q is not an http(s)://HOST:PORT URL", c.ClientURL)
	}
	if c.Dir == "" {
		c.Dir = filepath.Join(dataDir, "etcd")
	}
	cfg := embed.NewConfig()
	cfg.Name = c.Name
	cfg.Dir = c.Dir
	cfg.InitialCluster = c.Peers
	cfg.InitialClusterToken = "kiln-tracker"
	self := peers[c.Name]
	cfg.AdvertisePeerUrls = []url.URL{*self}
	cfg.ListenPeerUrls = []url.URL{bindURL(*self)}
	cfg.AdvertiseClientUrls = []url.URL{*client}
	cfg.ListenClientUrls = []url.URL{bindURL(*client)}
	cfg.UnsafeNoFsync = c.noFsync
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(nopZap)
	if c.CertFile != "" || c.KeyFile != "" || c.CAFile != "" {
		if c.CertFile == "" || c.KeyFile == "" || c.CAFile == "" {
			return nil, fmt.Errorf("cluster peer TLS needs a certificate, its key and the CA bundle together")
		}
		cfg.PeerTLSInfo = transport.TLSInfo{CertFile: c.CertFile, KeyFile: c.KeyFile, TrustedCAFile: c.CAFile, ClientCertAuth: true}
	}
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return nil, fmt.Errorf("start embedded etcd member %s (peers %s): %w", c.Name, c.Peers, err)
	}
	select {
	case <-e.Server.ReadyNotify():
		return e, nil
	case err := <-e.Err():
		e.Close()
		return nil, fmt.Errorf("embedded etcd member %s: %w", c.Name, err)
	case <-time.After(wait):
		e.Server.Stop()
		e.Close()
		return nil, fmt.Errorf("embedded etcd member %s did not join its cluster within %v: are a majority of the members in %s started?", c.Name, wait, c.Peers)
	}
}

// nopZap silences the etcd libraries' own logging: the tracker logs what
// matters of it.
var nopZap = zap.NewNop()
