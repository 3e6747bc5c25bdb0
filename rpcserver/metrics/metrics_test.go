package metrics

import (
	"io"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/internal/check"
)

func TestWriteText(t *testing.T) {
	r := NewRegistry()
	active := r.Gauge("kiln_sessions_active", "Sessions open now.")
	calls := r.Counter("kiln_calls_total", "Calls served.", "method")
	lat := r.Histogram("kiln_call_seconds", "Call latency.", []float64{0.1, 1}, "method")
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
	want := `# HELP kiln_sessions_active Sessions open now.
# TYPE kiln_sessions_active gauge
kiln_sessions_active 1
# HELP kiln_calls_total Calls served.
# TYPE kiln_calls_total counter
kiln_calls_total{method="file.list"} 2
kiln_calls_total{method="func.call"} 1
kiln_calls_total{method="we\"ird"} 1
# HELP kiln_call_seconds Call latency.
# TYPE kiln_call_seconds histogram
kiln_call_seconds_bucket{method="func.call",le="0.1"} 1
kiln_call_seconds_bucket{method="func.call",le="1"} 2
kiln_call_seconds_bucket{method="func.call",le="+Inf"} 3
kiln_call_seconds_sum{method="func.call"} 3.55
kiln_call_seconds_count{method="func.call"} 3
`
	check.Equal(t, b.String(), want)
}

func TestHandler(t *testing.T) {
	r := NewRegistry()
	r.Counter("x_total", "X.").Inc()
	srv := httptest.NewServer(r.Handler())
	defer srv.Close()
	resp, err := srv.Client().Get(srv.URL + "/metrics")
	check.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	check.NoError(t, err)
	check.Equal(t, resp.Header.Get("Content-Type"), ContentType)
	check.True(t, strings.Contains(string(body), "x_total 1\n"), string(body))
}
