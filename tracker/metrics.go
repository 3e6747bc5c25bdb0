package tracker

import (
	"io"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kiln-ml/kiln/internal/metrics"
	"github.com/kiln-ml/kiln/rpcserver/proto"
)

// trackerMetrics are the tracker's counters and histograms (safe for
// concurrent use); the gauges are computed when scraped by
// snapshotCollector.
type trackerMetrics struct {
	reg                                                                   *metrics.Registry
	leaseRequests, leasesGranted, leasesReleased, leasesExpired, failures *metrics.Counter
	leaseWait, jobQueueWait, jobRun                                       *metrics.Histogram
	storeSync, storeCheckpoint                                            *metrics.Histogram
}

func (s *Server) initMetrics() {
	r := metrics.NewRegistry()
	s.m = trackerMetrics{
		reg:            r,
		leaseRequests:  r.Counter("kiln_tracker_lease_requests_total", "Lease requests received."),
		leasesGranted:  r.Counter("kiln_tracker_leases_granted_total", "Leases granted."),
		leasesReleased: r.Counter("kiln_tracker_leases_released_total", "Leases ended (released or expired)."),
		leasesExpired:  r.Counter("kiln_tracker_leases_expired_total", "Leases that expired unrenewed."),
		failures:       r.Counter("kiln_tracker_device_failures_total", "Device failures reported."),
		leaseWait: r.Histogram("kiln_tracker_lease_wait_seconds", "Time from lease request to grant.",
			[]float64{0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 60, 300}),
		jobQueueWait: r.Histogram("kiln_tracker_job_queue_seconds", "Time build jobs waited in the queue before a compiler node took them.",
			[]float64{0.01, 0.1, 1, 10, 60, 300, 1800, 3600}),
		jobRun: r.Histogram("kiln_tracker_job_duration_seconds", "Time build jobs ran on a compiler node until they finished.",
			[]float64{0.1, 0.5, 1, 5, 10, 30, 60, 300, 600}),
		storeSync: r.Histogram("kiln_tracker_store_sync_seconds", "Time to make one batch of state changes durable (a write-ahead log record and its fdatasync); grants wait for it.",
			[]float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5}),
		storeCheckpoint: r.Histogram("kiln_tracker_store_checkpoint_seconds", "Time to apply the logged batches to tracker.db (a synced bbolt transaction); nothing waits for it.",
			[]float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1}),
	}
	insecure := s.cfg.Insecure && proto.CheckExposure("tracker", s.cfg.Listen, s.cfg.Token, s.cfg.TLS, "--insecure") != nil
	r.Flag("kiln_tracker_insecure", "1 when the tracker was started with --insecure and listens beyond loopback with neither a token nor mutual TLS.", insecure)
	r.Register(snapshotCollector{s})
}

// Descriptions of the gauges computed from the tracker's state.
var (
	descNodes      = prometheus.NewDesc("kiln_tracker_nodes", "Registered nodes by role and state.", []string{"role", "state"}, nil)
	descQueueDepth = prometheus.NewDesc("kiln_tracker_queue_depth", "Lease requests waiting, by queue.", []string{"queue"}, nil)
	descBuildQueue = prometheus.NewDesc("kiln_tracker_build_queue_depth", "Build jobs waiting for a compiler node (what an autoscaler of compiler nodes scales on).", nil, nil)
	descLeases     = prometheus.NewDesc("kiln_tracker_leases", "Leases outstanding.", nil, nil)
	descJobs       = prometheus.NewDesc("kiln_tracker_jobs", "Build jobs by state.", []string{"state"}, nil)
	descTVMServers = prometheus.NewDesc("kiln_tracker_tvm_servers", "TVM rpc servers registered through the TVM protocol.", nil, nil)
	descTVMPending = prometheus.NewDesc("kiln_tracker_tvm_pending", "TVM requests waiting.", nil, nil)
)

// snapshotCollector reads the tracker's gauges under its lock at scrape
// time.
type snapshotCollector struct{ s *Server }

func (c snapshotCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descNodes, descQueueDepth, descBuildQueue, descLeases, descJobs, descTVMServers, descTVMPending} {
		ch <- d
	}
}

func (c snapshotCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.s
	gauge := func(d *prometheus.Desc, v int, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, float64(v), labels...)
	}
	type nk struct {
		role  proto.NodeRole
		state proto.NodeState
	}
	s.mu.Lock()
	nodes := map[nk]int{}
	for _, n := range s.nodes {
		nodes[nk{n.role, n.state()}]++
	}
	queues := map[string]int{}
	for name, q := range s.queues {
		queues[name] = len(q.tickets)
	}
	leases := len(s.leases)
	jobs := map[proto.JobState]int{}
	for _, j := range s.jobs {
		jobs[j.State]++
	}
	s.mu.Unlock()
	for _, role := range []proto.NodeRole{proto.NodeDevice, proto.NodeCompiler} {
		for _, st := range []proto.NodeState{proto.StateFree, proto.StateBusy, proto.StateLost, proto.StateQuarantined} {
			gauge(descNodes, nodes[nk{role, st}], string(role), string(st))
		}
	}
	for name, n := range queues {
		gauge(descQueueDepth, n, name)
	}
	gauge(descLeases, leases)
	gauge(descBuildQueue, jobs[proto.JobQueued])
	for _, st := range []proto.JobState{proto.JobQueued, proto.JobRunning, proto.JobSucceeded, proto.JobFailed, proto.JobCancelled} {
		gauge(descJobs, jobs[st], string(st))
	}
	tvmServers, tvmPending := s.tvm.counts()
	gauge(descTVMServers, tvmServers)
	gauge(descTVMPending, tvmPending)
}

func (s *Server) metricsHandler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", s.m.reg.Handler())
	metrics.HandleHealth(mux, s.Ready)
	return mux
}

// WriteMetrics writes the tracker's metrics, with the Go runtime's and the
// process's, in the Prometheus text format.
func (s *Server) WriteMetrics(w io.Writer) error {
	if s.rep != nil {
		if t := s.rep.currentTerm(); t != nil {
			return t.WriteMetrics(w) // a leading replica's are its term's
		}
	}
	return s.m.reg.WriteText(w)
}
