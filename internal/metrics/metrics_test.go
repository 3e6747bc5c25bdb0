package metrics

import (
	"io"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/internal/check"
)

// kilnLines returns the lines of a text exposition that belong to kiln's
// own families (not the Go and process collectors').
func kilnLines(text string) string {
	var b strings.Builder
	for _, l := range strings.SplitAfter(text, "\n") {
		if strings.HasPrefix(l, "kiln_") || strings.HasPrefix(l, "# HELP kiln_") || strings.HasPrefix(l, "# TYPE kiln_") {
			b.WriteString(l)
		}
	}
	return b.String()
}

func TestWriteText(t *testing.T) {
	r := NewRegistry()
	active := r.Gauge("kiln_sessions_active", "Sessions open now.")
	calls := r.Counter("kiln_calls_total", "Calls served.", "method")
	lat := r.Histogram("kiln_call_seconds", "Call latency.", []float64{1, 0.1}, "method")
	r.Flag("kiln_insecure", "1 when started with --insecure.", true)
	r.Counter("kiln_untouched_total", "Never incremented.")
	r.Flag("kiln_sandbox_unavailable", "1 when sessions run without the sandbox.", false)
	active.Set(2)
	active.Add(-1)
	calls.Inc("func.call")
	calls.Add(2, "file.list")
	lat.Observe(0.05, "func.call")
	lat.Observe(0.5, "func.call")
	lat.Observe(3, "func.call")
	calls.Inc(`we"ird`)

	var b strings.Builder
	check.NoError(t, r.WriteText(&b))
	want := `# HELP kiln_call_seconds Call latency.
# TYPE kiln_call_seconds histogram
kiln_call_seconds_bucket{method="func.call",le="0.1"} 1
kiln_call_seconds_bucket{method="func.call",le="1"} 2
kiln_call_seconds_bucket{method="func.call",le="+Inf"} 3
kiln_call_seconds_sum{method="func.call"} 3.55
kiln_call_seconds_count{method="func.call"} 3
# HELP kiln_calls_total Calls served.
# TYPE kiln_calls_total counter
kiln_calls_total{method="file.list"} 2
kiln_calls_total{method="func.call"} 1
kiln_calls_total{method="we\"ird"} 1
# HELP kiln_insecure 1 when started with --insecure.
# TYPE kiln_insecure gauge
kiln_insecure 1
# HELP kiln_sandbox_unavailable 1 when sessions run without the sandbox.
# TYPE kiln_sandbox_unavailable gauge
kiln_sandbox_unavailable 0
# HELP kiln_sessions_active Sessions open now.
# TYPE kiln_sessions_active gauge
kiln_sessions_active 1
# HELP kiln_untouched_total Never incremented.
# TYPE kiln_untouched_total counter
kiln_untouched_total 0
`
	check.Equal(t, kilnLines(b.String()), want)
}

func TestRegisterTwicePanics(t *testing.T) {
	r := NewRegistry()
	r.Counter("x_total", "X.")
	defer func() { check.True(t, recover() != nil, "a second x_total was registered") }()
	r.Counter("x_total", "X again.")
}

// TestHandlerGoAndProcess scrapes the handler as Prometheus does: kiln's
// series come with the client library's go_ and process_ series.
func TestHandlerGoAndProcess(t *testing.T) {
	r := NewRegistry()
	r.Counter("x_total", "X.").Inc()
	srv := httptest.NewServer(r.Handler())
	defer srv.Close()
	resp, err := srv.Client().Get(srv.URL + "/metrics")
	check.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	check.NoError(t, err)
	check.True(t, strings.HasPrefix(resp.Header.Get("Content-Type"), "text/plain; version=0.0.4"), resp.Header.Get("Content-Type"))
	for _, want := range []string{"x_total 1\n", "\ngo_goroutines ", "\ngo_memstats_alloc_bytes ", "\nprocess_resident_memory_bytes ", "\nprocess_open_fds "} {
		check.True(t, strings.Contains(string(body), want), "missing", want, "in", string(body))
	}
}
