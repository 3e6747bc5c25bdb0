package cli

import (
	"fmt"

	ucli "github.com/urfave/cli/v2"

	"github.com/kiln-ml/kiln/rpcserver/proto"
	"github.com/kiln-ml/kiln/tracker"
)

// trackerHAFlags are the flags that make a tracker one replica of several
// over etcd.
func trackerHAFlags() []ucli.Flag {
	return []ucli.Flag{
		&ucli.StringFlag{Name: "store", Usage: "where the tracker keeps its state: DATA/tracker.db (bbolt) when unset, or an etcd cluster, etcd://HOST:PORT[,HOST:PORT...]; over etcd several trackers given the same store are replicas: one leads, the others forward every connection to it and take over when it dies"},
		&ucli.StringFlag{Name: "etcd-cacert", Usage: "PEM bundle of the CAs that sign the etcd servers' certificates (turns TLS on toward etcd; without it --store needs --store-insecure)"},
		&ucli.BoolFlag{Name: "store-insecure", Usage: "reach --store etcd over plain http, without TLS or authentication (anything that reaches etcd then reads and rewrites the fleet's state); a warning is printed"},
		&ucli.StringFlag{Name: "etcd-cert", Usage: "client certificate (PEM) presented to etcd"},
		&ucli.StringFlag{Name: "etcd-key", Usage: "key (PEM) of --etcd-cert"},
		&ucli.StringFlag{Name: "advertise", Usage: "HOST:PORT the other replicas forward connections to while this one leads (default: --listen, with this machine's host name when it binds every address)"},
		&ucli.StringFlag{Name: "cluster-name", Usage: "run an embedded etcd member under this name (one of --cluster-peers); without --store the tracker keeps its state there, so three trackers need no etcd of their own"},
		&ucli.StringFlag{Name: "cluster-peers", Usage: "every embedded member as NAME=URL, comma-separated: a=https://h1:2380,b=https://h2:2380,c=https://h3:2380; peers speak mutual TLS, with certificates from a CA derived from the fleet token (--token-file, the same on every member), or --tls-cert, --tls-key and --tls-client-ca when all three are given"},
		&ucli.StringFlag{Name: "cluster-client-url", Value: "https://127.0.0.1:2379", Usage: "where the embedded member serves etcd clients (an https://IP:PORT; only this tracker, with a certificate from the member's own CA in DATA/etcd/tls, is served)"},
	}
}

// trackerHA reads the flags of trackerHAFlags into cfg.
func trackerHA(c *ucli.Context, cfg *tracker.Config) error {
	cfg.Store = c.String("store")
	cfg.StoreInsecure = c.Bool("store-insecure")
	cfg.Advertise = c.String("advertise")
	if cfg.StoreInsecure && cfg.Store == "" {
		return fmt.Errorf("--store-insecure needs --store etcd://...")
	}
	if cfg.StoreInsecure && c.String("etcd-cacert") != "" {
		return fmt.Errorf("--store-insecure and --etcd-cacert contradict each other: TLS toward etcd is on with --etcd-cacert")
	}
	if ca, cert, key := c.String("etcd-cacert"), c.String("etcd-cert"), c.String("etcd-key"); ca != "" || cert != "" || key != "" {
		if cfg.Store == "" {
			return fmt.Errorf("--etcd-cacert, --etcd-cert and --etcd-key need --store etcd://...")
		}
		if ca == "" {
			return fmt.Errorf("--etcd-cert and --etcd-key need --etcd-cacert (the CAs that sign the etcd servers' certificates)")
		}
		t, err := proto.TLSConfig{CertFile: cert, KeyFile: key, CAFile: ca}.Client()
		if err != nil {
			return fmt.Errorf("tls toward etcd: %w", err)
		}
		cfg.EtcdTLS = t
	}
	name, peers := c.String("cluster-name"), c.String("cluster-peers")
	switch {
	case name == "" && peers == "":
		if c.IsSet("cluster-client-url") {
			return fmt.Errorf("--cluster-client-url needs --cluster-name and --cluster-peers")
		}
		return nil
	case name == "" || peers == "":
		return fmt.Errorf("--cluster-name and --cluster-peers go together")
	}
	cfg.Cluster = &tracker.ClusterConfig{
		Name: name, Peers: peers, ClientURL: c.String("cluster-client-url"),
		CertFile: c.String("tls-cert"), KeyFile: c.String("tls-key"), CAFile: c.String("tls-client-ca"),
	}
	return nil
}
