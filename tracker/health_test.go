package tracker

import (
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kiln-ml/kiln/internal/check"
	metricsrv "github.com/kiln-ml/kiln/internal/metrics"
	"github.com/kiln-ml/kiln/tracker/store"
)

// unreachableStore is a store whose backing service can be cut, as a
// network store's can.
type unreachableStore struct {
	store.Backend
	down atomic.Bool
}

func (u *unreachableStore) Ready() error {
	if u.down.Load() {
		return errors.New("store: etcd endpoints 127.0.0.1:1 unreachable")
	}
	return nil
}

// probe GETs path on the tracker's metrics listener and returns the status
// and body.
func probe(t *testing.T, addr, path string) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + addr + path)
	check.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	check.NoError(t, err)
	return resp.StatusCode, string(body)
}

// TestHealthProbes: /healthz answers while the process serves; /readyz
// only while the store is reachable, with the store's reason when not; a
// bbolt tracker is ready as soon as it serves.
func TestHealthProbes(t *testing.T) {
	cfg := fastConfig(t)
	cfg.MetricsListen = "127.0.0.1:0"
	s, err := New(cfg)
	check.NoError(t, err)
	check.NoError(t, s.Ready(), "bbolt store")
	st := &unreachableStore{Backend: s.st}
	s.st = st
	tr := runServer(t, s)
	addr := tr.MetricsAddr()

	code, body := probe(t, addr, "/healthz")
	check.Equal(t, code, http.StatusOK, body)
	code, body = probe(t, addr, "/readyz")
	check.Equal(t, code, http.StatusOK, body)

	st.down.Store(true)
	code, body = probe(t, addr, "/readyz")
	check.Equal(t, code, http.StatusServiceUnavailable, body)
	check.True(t, strings.Contains(body, "127.0.0.1:1 unreachable"), body)
	code, body = probe(t, addr, "/healthz")
	check.Equal(t, code, http.StatusOK, body)

	st.down.Store(false)
	code, body = probe(t, addr, "/readyz")
	check.Equal(t, code, http.StatusOK, body)

	tr.stop(t)
	check.True(t, tr.Ready() != nil, "a stopped tracker says it is ready")
}

// TestProbesUnderIdleFlood: more idle, unauthenticated connections than
// the metrics listener holds do not keep the tracker's probes unanswered.
func TestProbesUnderIdleFlood(t *testing.T) {
	cfg := fastConfig(t)
	cfg.MetricsListen = "127.0.0.1:0"
	s, err := New(cfg)
	check.NoError(t, err)
	tr := runServer(t, s)
	addr := tr.MetricsAddr()
	for range metricsrv.MaxConns + 16 {
		c, err := net.Dial("tcp", addr)
		check.NoError(t, err)
		t.Cleanup(func() { c.Close() })
	}
	// Longer than Kubernetes' default probe timeout (1 s).
	probe := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	for _, path := range []string{"/healthz", "/readyz"} {
		resp, err := probe.Get("http://" + addr + path)
		check.NoError(t, err, path)
		resp.Body.Close()
		check.Equal(t, resp.StatusCode, http.StatusOK, path)
	}
}
