package tracker

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/client"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/rpcserver/proto"
)

// TestMetrics scrapes /metrics as Prometheus does: the tracker's own series
// and the client library's go_ and process_ series.
func TestMetrics(t *testing.T) {
	cfg := fastConfig(t)
	cfg.MetricsListen = "127.0.0.1:0"
	tr := startTracker(t, cfg)
	ctx := testCtx(t)
	device(t, tr.Addr(), "k", proto.NodeAttrs{})
	tc := dialTracker(t, tr.Addr())
	l, err := tc.RequestLease(ctx, client.LeaseRequest{Key: "k"})
	check.NoError(t, err)
	defer l.Release(ctx)
	// No compiler node: the build waits in the queue.
	_, err = tc.SubmitBuild(ctx, proto.BuildSubmitArgs{Module: module, Target: "cpu"})
	check.NoError(t, err)

	resp, err := http.Get("http://" + tr.MetricsAddr() + "/metrics")
	check.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	check.NoError(t, err)
	text := string(body)
	check.True(t, strings.HasPrefix(resp.Header.Get("Content-Type"), "text/plain"), resp.Header)
	for _, want := range []string{
		`kiln_tracker_nodes{role="device",state="busy"} 1`,
		"kiln_tracker_leases 1\n",
		"kiln_tracker_leases_granted_total 1\n",
		"# TYPE kiln_tracker_lease_wait_seconds histogram",
		`kiln_tracker_lease_wait_seconds_bucket{le="+Inf"} 1`,
		`kiln_tracker_jobs{state="queued"} 1`,
		"kiln_tracker_build_queue_depth 1\n",
		"# TYPE kiln_tracker_job_duration_seconds histogram",
		"# TYPE kiln_tracker_store_sync_seconds histogram",
		"# TYPE kiln_tracker_store_checkpoint_seconds histogram",
		"kiln_tracker_insecure 0\n",
		// The client library's Go and process collectors.
		"\ngo_goroutines ", "\ngo_memstats_heap_alloc_bytes ", "\nprocess_resident_memory_bytes ", "\nprocess_open_fds ",
	} {
		check.True(t, strings.Contains(text, want), want, text)
	}
	// The grant was made durable through the log: a sync was observed.
	check.True(t, strings.Contains(text, "\nkiln_tracker_store_sync_seconds_count ") && !strings.Contains(text, "\nkiln_tracker_store_sync_seconds_count 0\n"), text)
	// Every sample line is "name{labels} value" or "name value".
	for _, line := range strings.Split(strings.TrimSpace(text), "\n") {
		if strings.HasPrefix(line, "#") {
			continue
		}
		check.Equal(t, len(strings.Fields(line)), 2, line)
	}
}
