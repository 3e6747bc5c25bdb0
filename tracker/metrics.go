package tracker

import (
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/kiln-ml/kiln/rpcserver/proto"
)

// metrics holds the tracker's counters and histograms, guarded by Server.mu.
type metrics struct {
	leaseRequests, leasesGranted, leasesReleased, leasesExpired, failures uint64
	leaseWait, jobQueueWait, jobRun                                       histogram
}

func (m *metrics) init() {
	m.leaseWait = newHistogram(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 60, 300)
	m.jobQueueWait = newHistogram(0.01, 0.1, 1, 10, 60, 300, 1800, 3600)
	m.jobRun = newHistogram(0.1, 0.5, 1, 5, 10, 30, 60, 300, 600)
}

// histogram is a Prometheus histogram: cumulative bucket counts are
// computed when written.
type histogram struct {
	bounds []float64
	counts []uint64 // per bucket, the last for +Inf
	sum    float64
	n      uint64
}

func newHistogram(bounds ...float64) histogram {
	return histogram{bounds: bounds, counts: make([]uint64, len(bounds)+1)}
}

func (h *histogram) observe(v float64) {
	i, _ := slices.BinarySearch(h.bounds, v)
	h.counts[i]++
	h.sum += v
	h.n++
}

func (h *histogram) write(w io.Writer, name, help string) {
	fmt.Fprintf(w, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name)
	var cum uint64
	for i, b := range h.bounds {
		cum += h.counts[i]
		fmt.Fprintf(w, "%s_bucket{le=%q} %d\n", name, strconv.FormatFloat(b, 'g', -1, 64), cum)
	}
	fmt.Fprintf(w, "%s_bucket{le=\"+Inf\"} %d\n%s_sum %g\n%s_count %d\n", name, h.n, name, h.sum, name, h.n)
}

func (s *Server) metricsHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/metrics", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		s.WriteMetrics(w)
	})
	return mux
}

// labelValue escapes a Prometheus label value.
func labelValue(s string) string {
	return strings.NewReplacer(`\`, `\\`, "\n", `\n`, `"`, `\"`).Replace(s)
}

// WriteMetrics writes the tracker's metrics in the Prometheus text format.
func (s *Server) WriteMetrics(w io.Writer) {
	var b strings.Builder
	s.mu.Lock()
	type nk struct {
		role  proto.NodeRole
		state proto.NodeState
	}
	nodes := map[nk]int{}
	for _, n := range s.nodes {
		nodes[nk{n.role, n.state()}]++
	}
	fmt.Fprintf(&b, "# HELP kiln_tracker_nodes Registered nodes by role and state.\n# TYPE kiln_tracker_nodes gauge\n")
	for _, role := range []proto.NodeRole{proto.NodeDevice, proto.NodeCompiler} {
		for _, st := range []proto.NodeState{proto.StateFree, proto.StateBusy, proto.StateLost, proto.StateQuarantined} {
			fmt.Fprintf(&b, "kiln_tracker_nodes{role=%q,state=%q} %d\n", role, st, nodes[nk{role, st}])
		}
	}
	fmt.Fprintf(&b, "# HELP kiln_tracker_queue_depth Lease requests waiting, by queue.\n# TYPE kiln_tracker_queue_depth gauge\n")
	names := make([]string, 0, len(s.queues))
	for name := range s.queues {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		fmt.Fprintf(&b, "kiln_tracker_queue_depth{queue=\"%s\"} %d\n", labelValue(name), len(s.queues[name].tickets))
	}
	fmt.Fprintf(&b, "# HELP kiln_tracker_leases Leases outstanding.\n# TYPE kiln_tracker_leases gauge\nkiln_tracker_leases %d\n", len(s.leases))
	counter := func(name, help string, v uint64) {
		fmt.Fprintf(&b, "# HELP %s %s\n# TYPE %s counter\n%s %d\n", name, help, name, name, v)
	}
	counter("kiln_tracker_lease_requests_total", "Lease requests received.", s.m.leaseRequests)
	counter("kiln_tracker_leases_granted_total", "Leases granted.", s.m.leasesGranted)
	counter("kiln_tracker_leases_released_total", "Leases ended (released or expired).", s.m.leasesReleased)
	counter("kiln_tracker_leases_expired_total", "Leases that expired unrenewed.", s.m.leasesExpired)
	counter("kiln_tracker_device_failures_total", "Device failures reported.", s.m.failures)
	jobs := map[proto.JobState]int{}
	for _, j := range s.jobs {
		jobs[j.State]++
	}
	fmt.Fprintf(&b, "# HELP kiln_tracker_jobs Build jobs by state.\n# TYPE kiln_tracker_jobs gauge\n")
	for _, st := range []proto.JobState{proto.JobQueued, proto.JobRunning, proto.JobSucceeded, proto.JobFailed, proto.JobCancelled} {
		fmt.Fprintf(&b, "kiln_tracker_jobs{state=%q} %d\n", st, jobs[st])
	}
	s.m.leaseWait.write(&b, "kiln_tracker_lease_wait_seconds", "Time from lease request to grant.")
	s.m.jobQueueWait.write(&b, "kiln_tracker_job_queue_seconds", "Time build jobs waited in the queue before a compiler node took them.")
	s.m.jobRun.write(&b, "kiln_tracker_job_duration_seconds", "Time build jobs ran on a compiler node until they finished.")
	s.mu.Unlock()
	tvmServers, tvmPending := s.tvm.counts()
	fmt.Fprintf(&b, "# HELP kiln_tracker_tvm_servers TVM rpc servers registered through the TVM protocol.\n# TYPE kiln_tracker_tvm_servers gauge\nkiln_tracker_tvm_servers %d\n", tvmServers)
	fmt.Fprintf(&b, "# HELP kiln_tracker_tvm_pending TVM requests waiting.\n# TYPE kiln_tracker_tvm_pending gauge\nkiln_tracker_tvm_pending %d\n", tvmPending)
	io.WriteString(w, b.String())
}
