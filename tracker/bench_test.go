package tracker

import (
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/kiln-ml/kiln/client"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/rpcserver/proto"
)

// BenchmarkTracker registers 1,000 simulated devices (each on its own
// connection, under 10 keys) and then runs 10,000 lease request/release
// cycles from 64 concurrent clients, per iteration. It reports lease
// requests per second and the p50/p99 latency of one RequestLease, on
// bbolt and on the leader of three replicas over their own three-member
// embedded etcd cluster (syncing to disk as bbolt does), in the same run.
func BenchmarkTracker(b *testing.B) {
	quiet := func(cfg *Config) {
		cfg.HeartbeatInterval = time.Minute // no heartbeat traffic in the figures
		cfg.LostAfter = time.Hour
	}
	b.Run("store=bbolt", func(b *testing.B) {
		cfg := fastConfig(b)
		quiet(&cfg)
		tr := startTracker(b, cfg)
		benchTracker(b, tr.Addr(), func() *Server { return tr.Server })
	})
	b.Run("store=etcd-3", func(b *testing.B) {
		rs := startReplicas(b, quiet, func(cfg *Config) { cfg.Cluster.noFsync = false })
		lead := rs.reps[rs.leader(b, -1)]
		benchTracker(b, lead.Addr(), lead.rep.currentTerm)
	})
}

func benchTracker(b *testing.B, addr string, server func() *Server) {
	const (
		devices  = 1000
		keys     = 10
		requests = 10000
		clients  = 64
	)
	ctx := testCtx(b)

	var regTotal time.Duration
	var lat []time.Duration
	var leaseTotal time.Duration
	for range b.N {
		// Register the fleet.
		start := time.Now()
		conns := make([]*proto.Client, devices)
		var wg sync.WaitGroup
		sem := make(chan struct{}, 32)
		for i := range devices {
			wg.Go(func() {
				sem <- struct{}{}
				defer func() { <-sem }()
				c, err := proto.Dial(ctx, addr, proto.DialOptions{Role: proto.RoleDevice, Logger: quietLogger()})
				if err != nil {
					b.Error(err)
					return
				}
				conns[i] = c
				args := proto.RegisterArgs{Role: proto.NodeDevice, Key: fmt.Sprintf("key%d", i%keys), Addr: fmt.Sprintf("10.0.%d.%d:9090", i/256, i%256)}
				if err := c.Call(ctx, proto.MethodTrackerRegister, args, nil); err != nil {
					b.Error(err)
				}
			})
		}
		wg.Wait()
		regTotal += time.Since(start)

		// Lease request/release cycles.
		tcs := make([]*client.Tracker, clients)
		for i := range tcs {
			tc, err := client.DialTracker(ctx, addr, client.TrackerOptions{Logger: quietLogger()})
			check.NoError(b, err)
			tcs[i] = tc
		}
		lats := make([][]time.Duration, clients)
		start = time.Now()
		for w := range clients {
			wg.Go(func() {
				for i := w; i < requests; i += clients {
					t0 := time.Now()
					l, err := tcs[w].RequestLease(ctx, client.LeaseRequest{Key: fmt.Sprintf("key%d", i%keys), NoRenew: true})
					lats[w] = append(lats[w], time.Since(t0))
					if err != nil {
						b.Error(err)
						return
					}
					if err := l.Release(ctx); err != nil {
						b.Error(err)
						return
					}
				}
			})
		}
		wg.Wait()
		leaseTotal += time.Since(start)
		for _, l := range lats {
			lat = append(lat, l...)
		}
		for _, tc := range tcs {
			tc.Close()
		}
		for _, c := range conns {
			if c != nil {
				c.Close()
			}
		}
		tr := server()
		eventually(b, "devices gone", func() bool { return allLost(tr) })
		tr.mu.Lock()
		for _, n := range tr.nodes {
			tr.forgetLocked(n, "benchmark reset")
		}
		tr.mu.Unlock()
	}
	slices.Sort(lat)
	pct := func(p float64) float64 { return lat[min(len(lat)-1, int(p*float64(len(lat))))].Seconds() * 1e6 }
	b.ReportMetric(float64(requests*b.N)/leaseTotal.Seconds(), "leases/s")
	b.ReportMetric(pct(0.50), "p50-lease-µs")
	b.ReportMetric(pct(0.99), "p99-lease-µs")
	b.ReportMetric(float64(devices*b.N)/regTotal.Seconds(), "registrations/s")
	b.ReportMetric(0, "ns/op")
}

func allLost(s *Server) bool {
	for _, d := range s.Summary(0).Devices {
		if d.State != proto.StateLost {
			return false
		}
	}
	return true
}
