package rpcserver_test

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/kiln-ml/kiln/client"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/internal/metrics"
	"github.com/kiln-ml/kiln/rpcserver"
	"github.com/kiln-ml/kiln/rpcserver/proto"
	"github.com/kiln-ml/kiln/tracker"
)

// probe answers a GET of path on the daemon's metrics listener handler.
func (td *testDaemon) probe(path string) (int, string) {
	rec := httptest.NewRecorder()
	td.d.HTTPHandler().ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
	return rec.Code, rec.Body.String()
}

// TestHealthProbes: a daemon serving direct sessions is ready; one that
// registers with a tracker is ready while registered and not ready, naming
// the tracker, once the tracker is gone, while /healthz stays 200.
func TestHealthProbes(t *testing.T) {
	direct := startDaemon(t, rpcserver.Config{})
	for _, path := range []string{"/healthz", "/readyz"} {
		code, body := direct.probe(path)
		check.Equal(t, code, http.StatusOK, path, body)
	}

	tr, err := tracker.New(tracker.Config{Listen: "127.0.0.1:0", DataDir: t.TempDir(), Token: "fleet",
		HeartbeatInterval: 50 * time.Millisecond, Logger: quietLog()})
	check.NoError(t, err)
	ctx, stopTracker := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- tr.Run(ctx) }()
	defer stopTracker()
	var reg *client.Registrar
	td := startDaemon(t, rpcserver.Config{Token: "fleet", Key: "k"}, func(d *rpcserver.Daemon) {
		reg = client.NewRegistrar(tr.Addr(), client.TrackerOptions{Token: "fleet", Logger: quietLog()},
			proto.RegisterArgs{Role: proto.NodeDevice, Key: "k", Addr: d.Addr().String()})
		d.SetTracker(reg)
	})
	select {
	case <-reg.Ready():
	case <-time.After(guard):
		t.Fatal("the daemon did not register")
	}
	code, body := td.probe("/readyz")
	check.Equal(t, code, http.StatusOK, body)

	stopTracker()
	select {
	case err := <-done:
		check.NoError(t, err, "tracker Run")
	case <-time.After(guard):
		t.Fatal("tracker did not stop")
	}
	eventually(t, "the daemon turns not ready", func() bool {
		code, body = td.probe("/readyz")
		return code == http.StatusServiceUnavailable
	})
	check.True(t, strings.Contains(body, "not connected to tracker "+tr.Addr()), body)
	code, body = td.probe("/healthz")
	check.Equal(t, code, http.StatusOK, body)
}

// TestProbesUnderIdleFlood: more idle, unauthenticated connections than
// the metrics listener holds do not keep the daemon's probes and scrapes
// unanswered.
func TestProbesUnderIdleFlood(t *testing.T) {
	td := startDaemon(t, rpcserver.Config{MetricsListen: "127.0.0.1:0"})
	addr := td.d.MetricsAddr()
	for range metrics.MaxConns + 16 {
		c, err := net.Dial("tcp", addr)
		check.NoError(t, err)
		t.Cleanup(func() { c.Close() })
	}
	// Longer than Kubernetes' default probe timeout (1 s).
	probe := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	for _, path := range []string{"/healthz", "/readyz", "/metrics"} {
		resp, err := probe.Get("http://" + addr + path)
		check.NoError(t, err, path)
		resp.Body.Close()
		check.Equal(t, resp.StatusCode, http.StatusOK, path)
	}
}
