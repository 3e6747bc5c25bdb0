// Package cmdline_test checks what kiln's Kubernetes overlays run (their
// kiln containers, as deploy/k8s's test rendered them into
// testdata/kiln-containers.json) against kiln itself: every command line
// is parsed by kiln's real CLI, every file it names lies in a volume the
// container mounts, and every probe asks the daemon's metrics listener for
// a path the real daemon answers.
package cmdline_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	ucli "github.com/urfave/cli/v2"

	"github.com/kiln-ml/kiln/cli"
	"github.com/kiln-ml/kiln/client"
	"github.com/kiln-ml/kiln/compilernode"
	"github.com/kiln-ml/kiln/deploy/k8s"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/rpcserver"
	"github.com/kiln-ml/kiln/rpcserver/proto"
	"github.com/kiln-ml/kiln/tracker"
)

// parsed is a kiln command line as kiln's CLI parsed it.
type parsed struct {
	command string
	flags   map[string]string // every flag set, by name
}

// parseArgs runs argv through kiln's real CLI with every command's action
// replaced: flags, their values and required flags are checked as at a
// real start, and nothing runs.
func parseArgs(argv []string) (parsed, error) {
	app := cli.App()
	var out bytes.Buffer
	app.Writer, app.ErrWriter = &out, &out
	var p parsed
	for _, cmd := range app.Commands {
		cmd.Action = func(c *ucli.Context) error {
			if c.NArg() > 0 {
				return fmt.Errorf("unexpected arguments %q", c.Args().Slice())
			}
			p.command = c.Command.Name
			p.flags = map[string]string{}
			for _, f := range c.Command.Flags {
				if name := f.Names()[0]; c.IsSet(name) {
					p.flags[name] = c.String(name)
				}
			}
			return nil
		}
	}
	if err := app.Run(argv); err != nil {
		return p, fmt.Errorf("%w (output: %s)", err, out.String())
	}
	if p.command == "" {
		return p, fmt.Errorf("no command ran (output: %s)", out.String())
	}
	return p, nil
}

// pathFlags name files or directories a daemon opens: each must lie in one
// of the container's volume mounts.
var pathFlags = []string{"data", "token-file", "tls-cert", "tls-key", "tls-ca", "tls-client-ca", "credential-file",
	"work-dir", "dir", "etcd-cacert", "etcd-cert", "etcd-key", "artifacts", "users-file", "tracker-token-file"}

// daemons are the metrics listeners of a tracker, a device daemon and a
// compiler node run here, by the kiln command that starts each.
type daemons map[string]string

// startDaemons starts a tracker, a device daemon registered with it and a
// compiler node in-process on loopback, and waits until both nodes are
// registered.
func startDaemons(t *testing.T) daemons {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	ctx, cancel := context.WithCancel(context.Background())
	tr, err := tracker.New(tracker.Config{Listen: "127.0.0.1:0", MetricsListen: "127.0.0.1:0", DataDir: t.TempDir(),
		HeartbeatInterval: 50 * time.Millisecond, Logger: quiet})
	check.NoError(t, err)
	trDone := make(chan error, 1)
	go func() { trDone <- tr.Run(ctx) }()

	d, err := rpcserver.New(rpcserver.Config{Listen: "127.0.0.1:0", Dir: t.TempDir(), Logger: quiet})
	check.NoError(t, err)
	reg := client.NewRegistrar(tr.Addr(), client.TrackerOptions{Logger: quiet},
		proto.RegisterArgs{Role: proto.NodeDevice, Key: "cpu", Addr: d.Addr().String()})
	d.SetTracker(reg)
	dDone := make(chan error, 1)
	go func() { dDone <- d.Run(ctx) }()
	dev := httptest.NewServer(d.HTTPHandler())

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	check.NoError(t, err)
	nodeMetrics := ln.Addr().String()
	ln.Close()
	ready := make(chan struct{})
	nDone := make(chan error, 1)
	go func() {
		nDone <- compilernode.Run(ctx, compilernode.Config{Tracker: tr.Addr(), Options: client.TrackerOptions{Logger: quiet}, Command: []string{"true"},
			WorkDir: t.TempDir(), MetricsListen: nodeMetrics, Ready: ready, Logger: quiet})
	}()
	t.Cleanup(func() {
		cancel()
		dev.Close()
		for _, done := range []chan error{trDone, dDone, nDone} {
			check.NoError(t, <-done)
		}
	})
	for _, c := range []<-chan struct{}{reg.Ready(), ready} {
		select {
		case <-c:
		case err := <-nDone:
			t.Fatalf("compiler node stopped: %v", err)
		case <-time.After(time.Minute): // a bound on the wait, not a speed threshold
			t.Fatal("the device daemon or the compiler node did not register")
		}
	}
	return daemons{"tracker": "http://" + tr.MetricsAddr(), "rpcserver": dev.URL, "compiler": "http://" + nodeMetrics}
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	check.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	check.NoError(t, err)
	return resp.StatusCode, string(b)
}

// peerURL is the URL --cluster-peers gives name ("" when none).
func peerURL(peers, name string) string {
	for _, p := range strings.Split(peers, ",") {
		if n, u, ok := strings.Cut(p, "="); ok && n == name {
			return u
		}
	}
	return ""
}

// TestCommandLines checks every kiln container of every overlay.
func TestCommandLines(t *testing.T) {
	g, err := k8s.ReadGolden(filepath.Join("..", k8s.GoldenFile))
	check.NoError(t, err)
	live := startDaemons(t)
	for _, k := range g.Containers {
		where := k.Overlay + ": " + k.Where
		p, err := parseArgs(k.Argv)
		if err != nil {
			t.Errorf("%s: kiln rejects its command line %q: %v", where, k.Argv, err)
			continue
		}
		for _, name := range pathFlags {
			v, ok := p.flags[name]
			if !ok || strings.Contains(v, "://") {
				continue
			}
			in := false
			for _, m := range k.Mounts {
				in = in || v == m || strings.HasPrefix(v, strings.TrimSuffix(m, "/")+"/")
			}
			check.True(t, in, where, "--"+name, v, "lies in none of its volume mounts", k.Mounts)
		}
		// Its probes ask its metrics listener for /healthz and /readyz,
		// which the real daemon answers.
		ml, ok := p.flags["metrics-listen"]
		check.True(t, ok, where, "has no --metrics-listen, so nothing answers its probes")
		_, port, err := net.SplitHostPort(ml)
		check.NoError(t, err, where, "--metrics-listen", ml)
		for _, pr := range []struct {
			kind string
			p    *k8s.Probe
			path string
		}{{"liveness", k.Liveness, "/healthz"}, {"readiness", k.Readiness, "/readyz"}} {
			check.True(t, pr.p != nil, where, "has no HTTP", pr.kind, "probe")
			check.Equal(t, pr.p.Path, pr.path, where, pr.kind, "probe path")
			check.Equal(t, strconv.Itoa(pr.p.Port), port, where, pr.kind, "probe port vs --metrics-listen", ml)
			base, ok := live[p.command]
			check.True(t, ok, where, "runs kiln", p.command, "which serves no probes")
			code, body := get(t, base+pr.path)
			check.Equal(t, code, http.StatusOK, where, pr.kind, "probe", pr.path, "answered", body)
		}
		// A device daemon serves its board kind under the kind's key.
		if board, ok := strings.CutPrefix(k.Target, "device-"); ok {
			check.Equal(t, p.flags["key"], board, where, "--key")
		}
		// Trackers that are several share one store: etcd's, or that of
		// the embedded members they run, each one named among the peers.
		if p.command == "tracker" && k.Replicas > 1 {
			name, embedded := p.flags["cluster-name"]
			check.True(t, strings.HasPrefix(p.flags["store"], "etcd://") || embedded, where,
				"has neither --store etcd://… nor --cluster-name; its replicas would each keep their own state")
			if embedded {
				check.True(t, peerURL(p.flags["cluster-peers"], name) != "", where, "--cluster-name", name, "is not one of --cluster-peers", p.flags["cluster-peers"])
			}
		}
	}
	// The autoscalers scale on metrics the tracker serves.
	_, metrics := get(t, live["tracker"]+"/metrics")
	for _, m := range g.ScaleMetrics {
		check.True(t, strings.Contains(metrics, "\n"+m+" "), "the autoscalers scale on", m, "which the tracker's /metrics lacks")
	}
}
