package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/kiln-ml/kiln/client"
	"github.com/kiln-ml/kiln/rpcserver/proto"
	"github.com/kiln-ml/kiln/tracker"
)

func init() {
	register(benchmark{
		name:    "tracker",
		summary: "a tracker on loopback: 1,000 simulated devices register, then 10,000 lease request/release cycles from 64 clients",
		run:     runTracker,
	})
}

// trackerResult is the tracker benchmark's report.
type trackerResult struct {
	Name            string  `json:"name"`
	LeasesPerS      float64 `json:"leases_per_s"`        // lease request+release cycles per second
	P50LeaseUS      float64 `json:"p50_lease_us"`        // one RequestLease, µs
	P99LeaseUS      float64 `json:"p99_lease_us"`        // one RequestLease, µs
	RegistrationsPS float64 `json:"registrations_per_s"` // dial + hello + register, per second
	Devices         int     `json:"devices"`
	Keys            int     `json:"keys"`
	Requests        int     `json:"requests"`
	Clients         int     `json:"clients"`
	Quick           bool    `json:"quick,omitempty"`
}

func (r trackerResult) Line() string {
	return fmt.Sprintf("tracker: %d devices registered at %.0f/s; %d lease request/release cycles from %d clients at %.0f/s, lease latency p50 %.0f µs, p99 %.0f µs",
		r.Devices, r.RegistrationsPS, r.Requests, r.Clients, r.LeasesPerS, r.P50LeaseUS, r.P99LeaseUS)
}

// runTracker starts a tracker in this process (its bbolt store in a
// temporary directory, so granted leases are written to disk as in
// production), registers the simulated devices (each on its own
// connection, spread over keys) and then runs the lease cycles.
func runTracker(ctx context.Context, opt options) (_ result, err error) {
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
		Listen: "127.0.0.1:0", DataDir: dir, Logger: quiet,
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
	lats := make([][]float64, clients)
	cerrs := make([]error, clients)
	start = time.Now()
	for w := range clients {
		wg.Go(func() {
			for i := w; i < requests; i += clients {
				t0 := time.Now()
				l, err := tcs[w].RequestLease(ctx, client.LeaseRequest{Key: fmt.Sprintf("key%d", i%keys), NoRenew: true})
				lats[w] = append(lats[w], float64(time.Since(t0).Nanoseconds())/1e3)
				if err == nil {
					err = l.Release(ctx)
				}
				if err != nil {
					cerrs[w] = err
					return
				}
			}
		})
	}
	wg.Wait()
	leaseTime := time.Since(start)
	if err := errors.Join(cerrs...); err != nil {
		return nil, fmt.Errorf("lease: %w", err)
	}
	var lat []float64
	for _, l := range lats {
		lat = append(lat, l...)
	}
	slices.Sort(lat)
	return trackerResult{
		Name: "tracker", LeasesPerS: round(float64(requests)/leaseTime.Seconds(), 1),
		P50LeaseUS: round(percentile(lat, 0.50), 1), P99LeaseUS: round(percentile(lat, 0.99), 1),
		RegistrationsPS: round(float64(devices)/regTime.Seconds(), 1),
		Devices:         devices, Keys: keys, Requests: requests, Clients: clients, Quick: opt.quick,
	}, nil
}
