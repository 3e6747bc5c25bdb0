// Package metrics owns a small metrics registry that writes Prometheus's text
// exposition format (version 0.0.4) by hand: counters, gauges and
// histograms, each with optional labels, and an http.Handler for /metrics.
// The device daemon and the tracker use it.
//
// metrics imports nothing from kiln.
package metrics

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
)

// ContentType is the Content-Type of the text exposition format.
const ContentType = "text/plain; version=0.0.4; charset=utf-8"

// DefaultBuckets are latency buckets in seconds, from 10 µs to 10 s.
var DefaultBuckets = []float64{1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}

// Registry holds metric families and writes them in registration order.
// It is safe for concurrent use.
type Registry struct {
	mu       sync.Mutex
	families []*family
	names    map[string]bool
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry { return &Registry{names: map[string]bool{}} }

// family is one metric name with its series.
type family struct {
	name, help, kind string
	labels           []string
	buckets          []float64 // histograms only

	mu     sync.Mutex
	series map[string]*series
}

// series is one combination of label values.
type series struct {
	values []string
	value  float64  // counter, gauge
	counts []uint64 // histogram: per bucket, not cumulative
	count  uint64   // histogram
	sum    float64  // histogram
}

func (r *Registry) add(name, help, kind string, labels []string, buckets []float64) *family {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.names[name] {
		panic(fmt.Sprintf("metrics: %q registered twice", name)) // a programming error
	}
	r.names[name] = true
	f := &family{name: name, help: help, kind: kind, labels: labels, buckets: buckets, series: map[string]*series{}}
	r.families = append(r.families, f)
	return f
}

// get returns the series of the label values, creating it.
func (f *family) get(values []string) *series {
	if len(values) != len(f.labels) {
		panic(fmt.Sprintf("metrics: %s takes %d label values, got %d", f.name, len(f.labels), len(values)))
	}
	key := strings.Join(values, "\xff")
	s := f.series[key]
	if s == nil {
		s = &series{values: slices.Clone(values)}
		if f.kind == "histogram" {
			s.counts = make([]uint64, len(f.buckets))
		}
		f.series[key] = s
	}
	return s
}

// Counter is a monotonically increasing count.
type Counter struct{ f *family }

// Counter registers a counter with the given label names.
func (r *Registry) Counter(name, help string, labels ...string) *Counter {
	return &Counter{r.add(name, help, "counter", labels, nil)}
}

// Add adds v (≥ 0) to the series of the label values.
func (c *Counter) Add(v float64, labelValues ...string) {
	c.f.mu.Lock()
	c.f.get(labelValues).value += v
	c.f.mu.Unlock()
}

// Inc adds 1.
func (c *Counter) Inc(labelValues ...string) { c.Add(1, labelValues...) }

// Gauge is a value that goes up and down.
type Gauge struct{ f *family }

// Gauge registers a gauge with the given label names.
func (r *Registry) Gauge(name, help string, labels ...string) *Gauge {
	return &Gauge{r.add(name, help, "gauge", labels, nil)}
}

// Set sets the series of the label values.
func (g *Gauge) Set(v float64, labelValues ...string) {
	g.f.mu.Lock()
	g.f.get(labelValues).value = v
	g.f.mu.Unlock()
}

// Add adds v (which may be negative).
func (g *Gauge) Add(v float64, labelValues ...string) {
	g.f.mu.Lock()
	g.f.get(labelValues).value += v
	g.f.mu.Unlock()
}

// Histogram counts observations in buckets.
type Histogram struct{ f *family }

// Histogram registers a histogram with upper bounds buckets (sorted; nil
// means DefaultBuckets) and the given label names.
func (r *Registry) Histogram(name, help string, buckets []float64, labels ...string) *Histogram {
	if buckets == nil {
		buckets = DefaultBuckets
	}
	b := slices.Clone(buckets)
	sort.Float64s(b)
	return &Histogram{r.add(name, help, "histogram", labels, b)}
}

// Observe records one observation.
func (h *Histogram) Observe(v float64, labelValues ...string) {
	i := sort.SearchFloat64s(h.f.buckets, v) // first bucket with bound ≥ v
	h.f.mu.Lock()
	s := h.f.get(labelValues)
	if i < len(s.counts) {
		s.counts[i]++
	}
	s.count++
	s.sum += v
	h.f.mu.Unlock()
}

// WriteText writes every family in the text exposition format.
func (r *Registry) WriteText(w io.Writer) error {
	r.mu.Lock()
	fams := slices.Clone(r.families)
	r.mu.Unlock()
	bw := bufio.NewWriter(w)
	for _, f := range fams {
		f.write(bw)
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("write metrics: %w", err)
	}
	return nil
}

func (f *family) write(w *bufio.Writer) {
	fmt.Fprintf(w, "# HELP %s %s\n# TYPE %s %s\n", f.name, escapeHelp(f.help), f.name, f.kind)
	f.mu.Lock()
	defer f.mu.Unlock()
	keys := make([]string, 0, len(f.series))
	for k := range f.series {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		s := f.series[k]
		if f.kind != "histogram" {
			fmt.Fprintf(w, "%s%s %s\n", f.name, labelText(f.labels, s.values, "", ""), formatFloat(s.value))
			continue
		}
		var cum uint64
		for i, b := range f.buckets {
			cum += s.counts[i]
			fmt.Fprintf(w, "%s_bucket%s %d\n", f.name, labelText(f.labels, s.values, "le", formatFloat(b)), cum)
		}
		fmt.Fprintf(w, "%s_bucket%s %d\n", f.name, labelText(f.labels, s.values, "le", "+Inf"), s.count)
		fmt.Fprintf(w, "%s_sum%s %s\n", f.name, labelText(f.labels, s.values, "", ""), formatFloat(s.sum))
		fmt.Fprintf(w, "%s_count%s %d\n", f.name, labelText(f.labels, s.values, "", ""), s.count)
	}
}

// labelText formats {a="x",b="y"} with an optional extra label.
func labelText(names, values []string, extraName, extraValue string) string {
	if len(names) == 0 && extraName == "" {
		return ""
	}
	var b strings.Builder
	b.WriteByte('{')
	for i, n := range names {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, "%s=\"%s\"", n, escapeLabel(values[i]))
	}
	if extraName != "" {
		if len(names) > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, "%s=\"%s\"", extraName, escapeLabel(extraValue))
	}
	b.WriteByte('}')
	return b.String()
}

func escapeLabel(s string) string {
	return strings.NewReplacer(`\`, `\\`, "\n", `\n`, `"`, `\"`).Replace(s)
}

func escapeHelp(s string) string {
	return strings.NewReplacer(`\`, `\\`, "\n", `\n`).Replace(s)
}

func formatFloat(v float64) string {
	switch {
	case math.IsInf(v, 1):
		return "+Inf"
	case math.IsInf(v, -1):
		return "-Inf"
	case math.IsNaN(v):
		return "NaN"
	}
	return strconv.FormatFloat(v, 'g', -1, 64)
}

// Handler returns an http.Handler that serves the registry.
func (r *Registry) Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		w.Header().Set("Content-Type", ContentType)
		r.WriteText(w)
	})
}
