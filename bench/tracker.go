package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/kiln-ml/kiln/client"
	"github.com/kiln-ml/kiln/rpcserver/proto"
	"github.com/kiln-ml/kiln/rpcserver/timer"
	"github.com/kiln-ml/kiln/tracker"
	"github.com/kiln-ml/kiln/tracker/ui"
)

func init() {
	register(benchmark{
		name:    "tracker",
		summary: "a tracker on loopback: 1,000 simulated devices register, then 10,000 lease request/release cycles from 64 clients; floor: a call that writes nothing from the same clients, and one fsync; the same cycles recording a result each (the cost of --record), and the web console's results view over the 10,000 results stored",
		run:     runTracker,
	})
}

// trackerResult is the tracker benchmark's report.
type trackerResult struct {
	Name            string  `json:"name"`
	LeasesPerS      float64 `json:"leases_per_s"`        // lease request+release cycles per second
	P50LeaseUS      float64 `json:"p50_lease_us"`        // one RequestLease, µs
	P99LeaseUS      float64 `json:"p99_lease_us"`        // one RequestLease, µs
	FloorP50US      float64 `json:"floor_p50_us"`        // a call that writes nothing, same clients, µs
	FloorP99US      float64 `json:"floor_p99_us"`        // a call that writes nothing, same clients, µs
	FsyncP50US      float64 `json:"fsync_p50_us"`        // 4 KiB write + fdatasync in the data dir, µs
	FsyncP99US      float64 `json:"fsync_p99_us"`        // 4 KiB write + fdatasync in the data dir, µs
	P99OverFloor    float64 `json:"p99_over_floor"`      // p99_lease_us / floor_p99_us
	RegistrationsPS float64 `json:"registrations_per_s"` // dial + hello + register, per second
	// The cost of recording: the same cycles with a result recorded in the
	// results store between the request and the release (kiln bench
	// --tracker --record), and the record call alone.
	RecordLeasesPerS float64 `json:"record_leases_per_s"` // lease request + record + release cycles per second
	RecordP50US      float64 `json:"record_p50_us"`       // one RecordResult (10 samples), µs
	RecordP99US      float64 `json:"record_p99_us"`       // one RecordResult (10 samples), µs
	// The web console's results view over the results then stored.
	ResultsStored    int     `json:"results_stored"`
	ResultsPageP50MS float64 `json:"results_page_p50_ms"` // GET /results, logged in: list, chart and table rendered
	ResultsPageP95MS float64 `json:"results_page_p95_ms"`
	ResultsPageKB    float64 `json:"results_page_kb"`
	ResultsAPIP50MS  float64 `json:"results_api_p50_ms"` // GET /api/results, the live script's poll
	fleetShape
}

// fleetShape is a tracker benchmark's size and the machine it ran on.
type fleetShape struct {
	Devices  int  `json:"devices"`
	Keys     int  `json:"keys"`
	Requests int  `json:"requests"`
	Clients  int  `json:"clients"`
	Quick    bool `json:"quick,omitempty"`
	// LoadAvg is the machine's 1-minute load average at the start and the
	// end of the run (/proc/loadavg; -1 where there is none): latency
	// percentiles on a machine with more runnable threads than cores
	// measure its scheduler as much as the tracker.
	LoadAvg [2]float64 `json:"load_avg_1m"`
	CPUs    int        `json:"cpus"`
}

func (r trackerResult) Line() string {
	return fmt.Sprintf("tracker: %d devices registered at %.0f/s; %d lease request/release cycles from %d clients at %.0f/s, lease latency p50 %.0f µs, p99 %.0f µs; floor (two calls writing nothing a cycle, same clients) p50 %.0f µs, p99 %.0f µs (lease p99 %.2fx); one fsync p50 %.0f µs, p99 %.0f µs; "+
		"with a result recorded each cycle %.0f/s (record p50 %.0f µs, p99 %.0f µs); console results view over %d stored results p50 %.1f ms, p95 %.1f ms (%.0f KB), its JSON poll p50 %.1f ms; load average %.1f → %.1f on %d CPUs",
		r.Devices, r.RegistrationsPS, r.Requests, r.Clients, r.LeasesPerS, r.P50LeaseUS, r.P99LeaseUS,
		r.FloorP50US, r.FloorP99US, r.P99OverFloor, r.FsyncP50US, r.FsyncP99US,
		r.RecordLeasesPerS, r.RecordP50US, r.RecordP99US, r.ResultsStored, r.ResultsPageP50MS, r.ResultsPageP95MS, r.ResultsPageKB, r.ResultsAPIP50MS,
		r.LoadAvg[0], r.LoadAvg[1], r.CPUs)
}

// loadAvg returns the 1-minute load average, -1 when /proc/loadavg cannot
// be read.
func loadAvg() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return -1
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return -1
	}
	v, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return -1
	}
	return v
}

// runTracker starts a tracker in this process (its bbolt store in a
// temporary directory, so granted leases are written to disk as in
// production), registers the simulated devices (each on its own
// connection, spread over keys) and then runs the lease cycles.
func runTracker(ctx context.Context, opt options) (_ result, err error) {
	load0 := loadAvg()
	devices, keys, requests, clients := 1000, 10, 10000, 64
	if opt.quick {
		devices, keys, requests, clients = 20, 4, 100, 4
	}
	dir, err := os.MkdirTemp("", "kiln-bench-tracker-")
	if err != nil {
		return nil, fmt.Errorf("temp dir: %w", err)
	}
	defer os.RemoveAll(dir)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	srv, err := tracker.New(tracker.Config{
		Listen: "127.0.0.1:0", DataDir: dir, Logger: quiet, MaxResultsPerUser: requests,
		HeartbeatInterval: time.Minute, LostAfter: time.Hour, // no heartbeat traffic in the figures
	})
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	defer func() {
		cancel()
		err = errors.Join(err, <-done)
	}()
	addr := srv.Addr()

	// Register the fleet, 32 at a time.
	conns := make([]*proto.Client, devices)
	defer func() {
		for _, c := range conns {
			if c != nil {
				c.Close()
			}
		}
	}()
	errs := make([]error, devices)
	var wg sync.WaitGroup
	sem := make(chan struct{}, 32)
	start := time.Now()
	for i := range devices {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			c, err := proto.Dial(ctx, addr, proto.DialOptions{Role: proto.RoleDevice, Logger: quiet})
			if err != nil {
				errs[i] = err
				return
			}
			conns[i] = c
			args := proto.RegisterArgs{Role: proto.NodeDevice, Key: fmt.Sprintf("key%d", i%keys),
				Addr: fmt.Sprintf("10.0.%d.%d:9090", i/256, i%256)}
			errs[i] = c.Call(ctx, proto.MethodTrackerRegister, args, nil)
		})
	}
	wg.Wait()
	regTime := time.Since(start)
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("register: %w", err)
	}

	// Lease request/release cycles.
	tcs := make([]*client.Tracker, clients)
	defer func() {
		for _, tc := range tcs {
			if tc != nil {
				tc.Close()
			}
		}
	}()
	for i := range tcs {
		if tcs[i], err = client.DialTracker(ctx, addr, client.TrackerOptions{Logger: quiet}); err != nil {
			return nil, err
		}
	}
	leaseTime, lat, err := trackerRound(clients, requests, func(w, i int) (time.Duration, error) {
		t0 := time.Now()
		l, err := tcs[w].RequestLease(ctx, client.LeaseRequest{Key: fmt.Sprintf("key%d", i%keys), NoRenew: true})
		took := time.Since(t0)
		if err == nil {
			err = l.Release(ctx)
		}
		return took, err
	})
	if err != nil {
		return nil, fmt.Errorf("lease: %w", err)
	}
	// The floor, from the same clients in the same run and in the same
	// shape (two calls a cycle, the first timed): a call that takes the
	// tracker's lock and writes nothing (the status of a job that does not
	// exist).
	_, floor, err := trackerRound(clients, requests, func(w, _ int) (time.Duration, error) {
		var took time.Duration
		for i := range 2 {
			t0 := time.Now()
			_, err := tcs[w].BuildStatus(ctx, "no-such-job")
			if i == 0 {
				took = time.Since(t0)
			}
			if !errors.Is(err, proto.ErrNotFound) {
				return 0, fmt.Errorf("want not found, got %v", err)
			}
		}
		return took, nil
	})
	if err != nil {
		return nil, fmt.Errorf("floor: %w", err)
	}
	fsync, err := fsyncLatency(dir, 200)
	if err != nil {
		return nil, err
	}
	// The same cycles again, recording a result in each (as kiln bench
	// --tracker does by default).
	var recLat []float64
	var recMu sync.Mutex
	recTime, _, err := trackerRound(clients, requests, func(w, i int) (time.Duration, error) {
		t0 := time.Now()
		l, err := tcs[w].RequestLease(ctx, client.LeaseRequest{Key: fmt.Sprintf("key%d", i%keys), NoRenew: true})
		took := time.Since(t0)
		if err != nil {
			return took, err
		}
		t1 := time.Now()
		_, err = tcs[w].RecordResult(ctx, benchResultOf(i, l))
		rt := time.Since(t1)
		recMu.Lock()
		recLat = append(recLat, float64(rt.Nanoseconds())/1e3)
		recMu.Unlock()
		if err == nil {
			err = l.Release(ctx)
		}
		return took, err
	})
	if err != nil {
		return nil, fmt.Errorf("lease and record: %w", err)
	}
	slices.Sort(recLat)
	page, err := consolePageLoad(ctx, srv)
	if err != nil {
		return nil, fmt.Errorf("console: %w", err)
	}
	p99 := percentile(lat, 0.99)
	return trackerResult{
		RecordLeasesPerS: round(float64(requests)/recTime.Seconds(), 1),
		RecordP50US:      round(percentile(recLat, 0.50), 1), RecordP99US: round(percentile(recLat, 0.99), 1),
		ResultsStored: page.stored, ResultsPageP50MS: round(page.p50, 2), ResultsPageP95MS: round(page.p95, 2),
		ResultsPageKB: round(page.kb, 1), ResultsAPIP50MS: round(page.api50, 2),
		Name: "tracker", LeasesPerS: round(float64(requests)/leaseTime.Seconds(), 1),
		P50LeaseUS: round(percentile(lat, 0.50), 1), P99LeaseUS: round(p99, 1),
		FloorP50US: round(percentile(floor, 0.50), 1), FloorP99US: round(percentile(floor, 0.99), 1),
		FsyncP50US: round(percentile(fsync, 0.50), 1), FsyncP99US: round(percentile(fsync, 0.99), 1),
		P99OverFloor:    round(p99/percentile(floor, 0.99), 2),
		RegistrationsPS: round(float64(devices)/regTime.Seconds(), 1),
		fleetShape: fleetShape{Devices: devices, Keys: keys, Requests: requests, Clients: clients, Quick: opt.quick,
			LoadAvg: [2]float64{load0, loadAvg()}, CPUs: runtime.NumCPU()},
	}, nil
}

// trackerRound runs requests calls of op spread over clients goroutines
// (op(w, i): client w, request i; it returns the latency it measured) and
// returns the time they took and the latencies in µs, sorted.
func trackerRound(clients, requests int, op func(w, i int) (time.Duration, error)) (time.Duration, []float64, error) {
	lats := make([][]float64, clients)
	errs := make([]error, clients)
	var wg sync.WaitGroup
	start := time.Now()
	for w := range clients {
		wg.Go(func() {
			for i := w; i < requests; i += clients {
				took, err := op(w, i)
				lats[w] = append(lats[w], float64(took.Nanoseconds())/1e3)
				if err != nil {
					errs[w] = err
					return
				}
			}
		})
	}
	wg.Wait()
	took := time.Since(start)
	if err := errors.Join(errs...); err != nil {
		return 0, nil, err
	}
	var all []float64
	for _, l := range lats {
		all = append(all, l...)
	}
	slices.Sort(all)
	return took, all, nil
}

// fsyncLatency writes 4 KiB and fdatasyncs it n times in dir (the
// tracker's data directory) and returns each round's latency in µs,
// sorted: the cost of one durable write on this disk.
func fsyncLatency(dir string, n int) ([]float64, error) {
	f, err := os.CreateTemp(dir, "fsync-")
	if err != nil {
		return nil, fmt.Errorf("fsync floor: %w", err)
	}
	defer os.Remove(f.Name())
	defer f.Close()
	buf := make([]byte, 4096)
	lat := make([]float64, 0, n)
	for i := range n {
		t0 := time.Now()
		if _, err := f.WriteAt(buf, int64(i%16)*4096); err != nil {
			return nil, fmt.Errorf("fsync floor: %w", err)
		}
		if err := syscall.Fdatasync(int(f.Fd())); err != nil {
			return nil, fmt.Errorf("fsync floor: %w", err)
		}
		lat = append(lat, float64(time.Since(t0).Nanoseconds())/1e3)
	}
	slices.Sort(lat)
	return lat, nil
}

// benchResultOf is the i-th cycle's recorded result: what kiln bench
// records of one timing (10 repeats), spread over 20 functions.
func benchResultOf(i int, l *client.Lease) proto.Result {
	xs := make([]float64, 10)
	for j := range xs {
		xs[j] = 1e-3 * (1 + 0.01*float64((i+j)%7))
	}
	sum := timer.Summarize(xs)
	rep := timer.Assess(xs, proto.MachineState{}, 0)
	return proto.Result{
		Label: fmt.Sprintf("run-%d", i%5), Source: proto.ResultSourceBench, Function: fmt.Sprintf("kernel%d", i%20),
		Target: "cpu", DeviceKey: l.Key, NodeID: l.NodeID, DeviceAttrs: l.Attrs, Inputs: []string{"A:float32[1024]", "B:float32[1024]"},
		Time: proto.TimeResult{Results: sum.Results, Mean: sum.Mean, Median: sum.Median, Min: sum.Min, Max: sum.Max, Std: sum.Std, Number: 100, Report: &rep},
	}
}

// pageLoad is the console's results view timed.
type pageLoad struct {
	stored       int
	p50, p95, kb float64
	api50        float64
}

// consolePageLoad serves the web console over srv on loopback, logs in
// (the tracker checks no token here) and times 30 loads of the results
// view and of its JSON form, after one warm-up of each.
func consolePageLoad(ctx context.Context, srv *tracker.Server) (pageLoad, error) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	con, err := ui.New(ui.Config{Tracker: srv, Logger: quiet})
	if err != nil {
		return pageLoad{}, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return pageLoad{}, err
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- con.Serve(ctx, ln) }()
	defer func() {
		cancel()
		<-done
	}()
	base := "http://" + ln.Addr().String()
	jar, err := cookiejar.New(nil)
	if err != nil {
		return pageLoad{}, err
	}
	hc := &http.Client{Jar: jar, Timeout: time.Minute}
	resp, err := hc.PostForm(base+"/login", url.Values{"token": {""}})
	if err != nil {
		return pageLoad{}, err
	}
	resp.Body.Close()
	load := func(path string) (float64, int, error) {
		t0 := time.Now()
		resp, err := hc.Get(base + path)
		if err != nil {
			return 0, 0, err
		}
		n, err := io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if err == nil && resp.StatusCode != http.StatusOK {
			err = fmt.Errorf("GET %s: %s", path, resp.Status)
		}
		return float64(time.Since(t0).Microseconds()) / 1e3, int(n), err
	}
	var out pageLoad
	var page, api []float64
	for i := range 31 {
		ms, n, err := load("/results")
		if err != nil {
			return out, err
		}
		ams, _, err := load("/api/results")
		if err != nil {
			return out, err
		}
		if i > 0 {
			page, api = append(page, ms), append(api, ams)
			out.kb = float64(n) / 1024
		}
	}
	slices.Sort(page)
	slices.Sort(api)
	out.p50, out.p95, out.api50 = percentile(page, 0.5), percentile(page, 0.95), percentile(api, 0.5)
	tc, err := client.DialTracker(ctx, srv.Addr(), client.TrackerOptions{Logger: quiet})
	if err != nil {
		return out, err
	}
	defer tc.Close()
	l, err := tc.ListResults(ctx, proto.ResultListArgs{Limit: 1})
	out.stored = l.Total
	return out, err
}
