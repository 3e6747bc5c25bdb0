// Package metrics owns kiln's Prometheus registries: a thin layer over
// github.com/prometheus/client_golang that gives the device daemon, the
// tracker and the compiler node counters, gauges and histograms with label
// values passed positionally, the client library's Go and process
// collectors on every registry, an http.Handler for /metrics, and the
// hardened HTTP server a /metrics listener runs (serve.go).
//
// metrics imports nothing from kiln.
package metrics

import (
	"fmt"
	"io"
	"net/http"
	"slices"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/common/expfmt"
)

// ContentType is the Content-Type WriteText's output is served with.
const ContentType = "text/plain; version=0.0.4; charset=utf-8"

// DefaultBuckets are latency buckets in seconds, from 10 µs to 10 s.
var DefaultBuckets = []float64{1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}

// Registry is a Prometheus registry that already carries the Go runtime's
// (go_*) and the process's (process_*) collectors. It is safe for
// concurrent use.
type Registry struct {
	reg *prometheus.Registry
}

// NewRegistry returns a registry with the Go and process collectors.
func NewRegistry() *Registry {
	r := &Registry{reg: prometheus.NewRegistry()}
	r.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return r
}

// Register adds a collector of the caller's own (for values computed when
// scraped). Registering a name twice panics: it is a programming error.
func (r *Registry) Register(c prometheus.Collector) { r.reg.MustRegister(c) }

// Counter is a monotonically increasing count.
type Counter struct{ v *prometheus.CounterVec }

// Counter registers a counter with the given label names. A metric without
// labels is exposed from the start, at 0; one with labels gets a series
// per label values once they are first used.
func (r *Registry) Counter(name, help string, labels ...string) *Counter {
	v := prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
	r.reg.MustRegister(v)
	if len(labels) == 0 {
		v.WithLabelValues() // shown as 0 before the first change
	}
	return &Counter{v}
}

// Add adds v (≥ 0) to the series of the label values.
func (c *Counter) Add(v float64, labelValues ...string) { c.v.WithLabelValues(labelValues...).Add(v) }

// Inc adds 1.
func (c *Counter) Inc(labelValues ...string) { c.Add(1, labelValues...) }

// Gauge is a value that goes up and down.
type Gauge struct{ v *prometheus.GaugeVec }

// Gauge registers a gauge with the given label names.
func (r *Registry) Gauge(name, help string, labels ...string) *Gauge {
	v := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, labels)
	r.reg.MustRegister(v)
	if len(labels) == 0 {
		v.WithLabelValues() // shown as 0 before the first change
	}
	return &Gauge{v}
}

// Set sets the series of the label values.
func (g *Gauge) Set(v float64, labelValues ...string) { g.v.WithLabelValues(labelValues...).Set(v) }

// Add adds v (which may be negative).
func (g *Gauge) Add(v float64, labelValues ...string) { g.v.WithLabelValues(labelValues...).Add(v) }

// Flag registers a gauge without labels set to 1 when on and 0 otherwise,
// for a condition an operator must notice (a daemon without its sandbox, a
// listener started with --insecure).
func (r *Registry) Flag(name, help string, on bool) {
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: help})
	if on {
		g.Set(1)
	}
	r.reg.MustRegister(g)
}

// Histogram counts observations in buckets.
type Histogram struct{ v *prometheus.HistogramVec }

// Histogram registers a histogram with upper bounds buckets (nil means
// DefaultBuckets) and the given label names.
func (r *Registry) Histogram(name, help string, buckets []float64, labels ...string) *Histogram {
	if buckets == nil {
		buckets = DefaultBuckets
	}
	b := slices.Clone(buckets)
	slices.Sort(b)
	v := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: help, Buckets: b}, labels)
	r.reg.MustRegister(v)
	if len(labels) == 0 {
		v.WithLabelValues() // shown as 0 before the first change
	}
	return &Histogram{v}
}

// Observe records one observation.
func (h *Histogram) Observe(v float64, labelValues ...string) {
	h.v.WithLabelValues(labelValues...).Observe(v)
}

// WriteText writes every family, sorted by name, in the text exposition
// format.
func (r *Registry) WriteText(w io.Writer) error {
	fams, err := r.reg.Gather()
	if err != nil {
		return fmt.Errorf("gather metrics: %w", err)
	}
	enc := expfmt.NewEncoder(w, expfmt.NewFormat(expfmt.TypeTextPlain))
	for _, f := range fams {
		if err := enc.Encode(f); err != nil {
			return fmt.Errorf("write metric %q: %w", f.GetName(), err)
		}
	}
	return nil
}

// Handler returns an http.Handler that serves the registry (the format
// negotiated with the scraper; plain text by default).
func (r *Registry) Handler() http.Handler {
	return promhttp.HandlerFor(r.reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError})
}
