package rpcserver

import (
	"errors"
	"net/http"

	"github.com/kiln-ml/kiln/internal/metrics"
)

// connectedTracker is a Tracker that knows whether it is registered with
// the tracker now (client.Registrar).
type connectedTracker interface {
	Connected() error
}

// Ready returns nil while the daemon takes sessions: it is not draining
// and, when it registers with a tracker, it is registered over a live
// connection (clients reach it only through the tracker's leases).
func (d *Daemon) Ready() error {
	d.mu.Lock()
	draining := d.draining
	d.mu.Unlock()
	if draining {
		return errors.New("device daemon is shutting down")
	}
	if c, ok := d.cfg.Tracker.(connectedTracker); ok {
		return c.Connected()
	}
	return nil
}

// HTTPHandler serves the daemon's metrics listener: /metrics, and the
// probes /healthz (alive) and /readyz (Ready).
func (d *Daemon) HTTPHandler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", d.MetricsHandler())
	metrics.HandleHealth(mux, d.Ready)
	return mux
}
