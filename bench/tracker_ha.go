package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/kiln-ml/kiln/client"
)

func init() {
	register(benchmark{
		name: "tracker-ha",
		summary: "kiln tracker processes on loopback, bbolt and a 3-member embedded etcd in the same run: 1,000 simulated devices, lease request/release cycles from 64 clients, " +
			"then kill -9 of the (leader) tracker under load: time until grants resume, build jobs lost, leases granted twice",
		run: runTrackerHA,
	})
}

// haStore is one store's figures.
type haStore struct {
	Store    string  `json:"store"`
	Trackers int     `json:"trackers"`
	LeasesPS float64 `json:"leases_per_s"` // request+release cycles per second
	P50US    float64 `json:"p50_lease_us"` // one RequestLease, µs
	P99US    float64 `json:"p99_lease_us"`
	// FailoverS is the time from kill -9 of the tracker serving the fleet
	// (the leader) to the first lease granted after it, on the trackers'
	// clock (a lease's Expires less its TTL). The single bbolt tracker is
	// started again at once on the same data: its figure is a restart's.
	FailoverS float64 `json:"failover_s"`
	// ElectedS is the part of it until another tracker said it leads
	// (its "tracker replica leads" log line); the rest is devices and
	// clients reconnecting and registering again. Only over etcd.
	ElectedS float64 `json:"elected_s,omitempty"`
	// JobsSubmitted were acknowledged by a tracker while jobs flowed
	// through the kill; JobsLost of them did not end succeeded;
	// JobsCompletedTwice were accepted as completed more than once.
	JobsSubmitted      int `json:"jobs_submitted"`
	JobsLost           int `json:"jobs_lost"`
	JobsCompletedTwice int `json:"jobs_completed_twice"`
	// LeasesGrantedTwice counts devices that arrived in a lease while
	// another lease on them was held.
	LeasesGrantedTwice int `json:"leases_granted_twice"`
	// ClientErrors counts lease cycles and submissions that failed even
	// after failing over (the clients carried on).
	ClientErrors int    `json:"client_errors"`
	FirstError   string `json:"first_error,omitempty"`
}

// trackerHAResult is the tracker-ha benchmark's report.
type trackerHAResult struct {
	Name         string   `json:"name"`
	LeasesPSBolt float64  `json:"leases_per_s_bbolt"`
	Bolt         haStore  `json:"bbolt"`
	Etcd         *haStore `json:"etcd,omitempty"`
	// EtcdNote says why there is no etcd figure.
	EtcdNote     string  `json:"etcd_note,omitempty"`
	EtcdOverBolt float64 `json:"etcd_over_bbolt,omitempty"` // leases/s ratio
	fleetShape
}

func (r trackerHAResult) Line() string {
	line := func(s haStore) string {
		elected := ""
		if s.ElectedS > 0 {
			elected = fmt.Sprintf(" (a new leader after %.2f s)", s.ElectedS)
		}
		return fmt.Sprintf("%s (%d tracker(s)): %.0f leases/s, p50 %.0f µs, p99 %.0f µs; kill -9 → grants again in %.2f s%s; jobs %d submitted, %d lost, %d completed twice; leases granted twice %d; client errors %d",
			s.Store, s.Trackers, s.LeasesPS, s.P50US, s.P99US, s.FailoverS, elected, s.JobsSubmitted, s.JobsLost, s.JobsCompletedTwice, s.LeasesGrantedTwice, s.ClientErrors)
	}
	out := fmt.Sprintf("tracker-ha: %d devices, %d clients, %d cycles a store; %s", r.Devices, r.Clients, r.Requests, line(r.Bolt))
	if r.Etcd != nil {
		out += fmt.Sprintf("; %s (%.2fx bbolt)", line(*r.Etcd), r.EtcdOverBolt)
	} else {
		out += "; etcd: " + r.EtcdNote
	}
	return out + fmt.Sprintf("; load average %.1f → %.1f on %d CPUs", r.LoadAvg[0], r.LoadAvg[1], r.CPUs)
}

// haSetup is a set of tracker processes under test.
type haSetup struct {
	store string
	list  string // the address list clients and nodes are given
	procs []*trackerProc
	// victim picks the tracker to kill (the leader).
	victim func(ctx context.Context) (*trackerProc, error)
	// recover runs after the kill (bbolt: start the tracker again).
	recover func(p *trackerProc) error
}

func (s haSetup) stop() {
	for _, p := range s.procs {
		p.stop()
	}
}

func runTrackerHA(ctx context.Context, opt options) (result, error) {
	load0 := loadAvg()
	sc := fleetShape{Devices: 1000, Keys: 10, Clients: 64, Requests: 10000, Quick: opt.quick, CPUs: runtime.NumCPU()}
	if opt.quick {
		sc.Devices, sc.Keys, sc.Clients, sc.Requests = 20, 4, 4, 100
	}
	dir, err := os.MkdirTemp("", "kiln-bench-tracker-ha-")
	if err != nil {
		return nil, fmt.Errorf("temp dir: %w", err)
	}
	defer os.RemoveAll(dir)
	fmt.Fprintln(os.Stderr, "tracker-ha: building kiln")
	bin, err := buildKiln(ctx, dir)
	if err != nil {
		return nil, err
	}
	const token = "bench-tracker-ha-token"
	tokFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokFile, []byte(token+"\n"), 0o600); err != nil {
		return nil, err
	}
	common := []string{"--token-file", tokFile, "--heartbeat", "1m"}

	bolt, err := boltSetup(bin, filepath.Join(dir, "bbolt"), common)
	if err != nil {
		return nil, err
	}
	fmt.Fprintln(os.Stderr, "tracker-ha: bbolt")
	boltRes, err := measureHA(ctx, bolt, token, sc)
	bolt.stop()
	if err != nil {
		return nil, fmt.Errorf("bbolt: %w", err)
	}
	res := trackerHAResult{
		Name: "tracker-ha", LeasesPSBolt: boltRes.LeasesPS, Bolt: boltRes, fleetShape: sc,
	}
	etcd, note, err := etcdSetup(ctx, bin, filepath.Join(dir, "etcd"), common)
	switch {
	case err != nil:
		return nil, fmt.Errorf("etcd: %w", err)
	case note != "":
		res.EtcdNote = note
	default:
		fmt.Fprintln(os.Stderr, "tracker-ha: etcd")
		etcdRes, err := measureHA(ctx, etcd, token, sc)
		etcd.stop()
		if err != nil {
			return nil, fmt.Errorf("etcd: %w", err)
		}
		res.Etcd = &etcdRes
		res.EtcdOverBolt = round(etcdRes.LeasesPS/boltRes.LeasesPS, 2)
	}
	res.LoadAvg = [2]float64{load0, loadAvg()}
	return res, nil
}

// boltSetup is one tracker on bbolt, started again at once after the kill.
func boltSetup(bin, dir string, common []string) (haSetup, error) {
	addr, err := freePort()
	if err != nil {
		return haSetup{}, err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return haSetup{}, err
	}
	p, err := startTrackerProc(bin, addr, filepath.Join(dir, "tracker.log"), append([]string{"--data", filepath.Join(dir, "data")}, common...)...)
	if err != nil {
		return haSetup{}, err
	}
	return haSetup{
		store: "bbolt", list: addr, procs: []*trackerProc{p},
		victim:  func(context.Context) (*trackerProc, error) { return p, nil },
		recover: func(p *trackerProc) error { return p.start() },
	}, nil
}

// measureHA registers the fleet, runs the lease cycles, then kills the
// victim under load and counts what the clients saw.
func measureHA(ctx context.Context, s haSetup, token string, sc fleetShape) (haStore, error) {
	out := haStore{Store: s.store, Trackers: len(s.procs)}
	if err := waitServing(ctx, s.list, token, 2*time.Minute); err != nil {
		return out, fmt.Errorf("%w\n%s", err, s.procs[0].logTail())
	}
	fl, err := startFleet(ctx, s.list, token, sc.Devices, sc.Keys)
	if err != nil {
		return out, err
	}
	defer fl.stop()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	opts := client.TrackerOptions{Token: token, Logger: quiet, FailoverTimeout: time.Minute}
	tcs := make([]*client.Tracker, sc.Clients+1) // the last one submits jobs
	defer func() {
		for _, tc := range tcs {
			if tc != nil {
				tc.Close()
			}
		}
	}()
	for i := range tcs {
		if tcs[i], err = client.DialTracker(ctx, s.list, opts); err != nil {
			return out, err
		}
	}
	lg := newLedger()
	took, lat, err := trackerRound(sc.Clients, sc.Requests, func(w, i int) (time.Duration, error) {
		return lg.cycle(ctx, tcs[w], fmt.Sprintf("key%d", i%sc.Keys))
	})
	if err != nil {
		return out, fmt.Errorf("lease cycles: %w", err)
	}
	out.LeasesPS = round(float64(sc.Requests)/took.Seconds(), 1)
	out.P50US, out.P99US = round(percentile(lat, 0.50), 1), round(percentile(lat, 0.99), 1)

	// Under load: lease cycles from every client, a job every 20 ms built
	// by two compiler nodes; kill the victim after a second of it.
	jb := newJobBook()
	jctx, stopJobs := context.WithCancel(ctx)
	defer stopJobs()
	cw, err := startCompilers(jctx, s.list, token, 2, jb)
	if err != nil {
		return out, err
	}
	lctx, stopLoad := context.WithCancel(ctx)
	defer stopLoad()
	lw := lg.leaseLoop(lctx, tcs[:sc.Clients], sc.Keys)
	submitter := tcs[sc.Clients]
	sdone := make(chan struct{})
	go func() {
		defer close(sdone)
		jb.submitLoop(lctx, submitter, 20*time.Millisecond)
	}()
	time.Sleep(time.Second)
	victim, err := s.victim(ctx)
	if err != nil {
		return out, err
	}
	t0 := time.Now()
	victim.kill(syscall.SIGKILL)
	if err := s.recover(victim); err != nil {
		return out, err
	}
	resumed, err := waitResumed(ctx, lg, t0, 2*time.Minute)
	if err != nil {
		return out, err
	}
	out.FailoverS = round(resumed.Sub(t0).Seconds(), 3)
	if at, ok := firstLogAfter(s.procs, `msg="tracker replica leads"`, t0); ok && len(s.procs) > 1 {
		out.ElectedS = round(at.Sub(t0).Seconds(), 3)
	}
	time.Sleep(time.Second)
	stopLoad()
	lw.Wait()
	<-sdone
	lost, twice, err := jb.settle(ctx, submitter, 2*time.Minute)
	stopJobs()
	cw.Wait()
	if err != nil {
		return out, err
	}
	out.JobsSubmitted, out.JobsLost, out.JobsCompletedTwice = len(jb.submitted), lost, twice
	out.LeasesGrantedTwice = len(lg.twice)
	errs := append(lg.errs, jb.errs...)
	out.ClientErrors = len(errs)
	if len(errs) > 0 {
		out.FirstError = errs[0].Error()
	}
	if len(lg.twice) > 0 {
		out.FirstError = strings.Join(lg.twice, "; ")
	}
	return out, nil
}

// waitResumed waits until a lease is granted after t0.
func waitResumed(ctx context.Context, lg *ledger, t0 time.Time, within time.Duration) (time.Time, error) {
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		if g, ok := lg.firstGrantAfter(t0); ok {
			return g, nil
		}
		select {
		case <-ctx.Done():
			return time.Time{}, ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
	return time.Time{}, errors.New("no lease granted within " + within.String() + " of the kill")
}

// etcdSetup starts three trackers, each with an embedded etcd member, as
// one cluster. note says why it cannot, when this kiln has no embedded
// etcd.
func etcdSetup(ctx context.Context, bin, dir string, common []string) (haSetup, string, error) {
	help, _ := exec.CommandContext(ctx, bin, "tracker", "--help").CombinedOutput()
	if !strings.Contains(string(help), "--cluster-peers") {
		return haSetup{}, "this kiln tracker has no embedded etcd member (--cluster-peers): nothing to measure", nil
	}
	procs, list, err := startCluster(bin, dir, 3, common)
	if err != nil {
		return haSetup{}, "", err
	}
	s := haSetup{store: "etcd (3 embedded members)", list: list, procs: procs}
	s.victim = func(ctx context.Context) (*trackerProc, error) { return leaderOf(ctx, procs, time.Minute) }
	s.recover = func(*trackerProc) error { return nil } // the others take over
	return s, "", nil
}
