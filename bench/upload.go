package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"time"

	"github.com/kiln-ml/kiln/client"
	"github.com/kiln-ml/kiln/rpcserver"
)

func init() {
	register(benchmark{
		name:    "upload",
		summary: "upload of a 64 MiB artifact to a device daemon's session on loopback",
		run:     runUpload,
	})
}

// uploadGoalGBps is the goal for the upload throughput on loopback.
const uploadGoalGBps = 2.5

// uploadResult is the upload benchmark's report. GB is 1e9 bytes.
type uploadResult struct {
	Name      string  `json:"name"`
	GBps      float64 `json:"gb_per_s"`      // median over the uploads
	BestGBps  float64 `json:"best_gb_per_s"` // the fastest upload
	MedianMS  float64 `json:"median_ms"`     // median time of one upload
	Bytes     int64   `json:"bytes"`         // bytes per upload
	Uploads   int     `json:"uploads"`
	GoalGBps  float64 `json:"goal_gb_per_s"`
	MeetsGoal bool    `json:"meets_goal"`
	// FloorGBps is plain TCP on loopback into a file in the same
	// directory, measured in the same rounds (median): what the machine
	// allows. Ratio is GBps / FloorGBps.
	FloorGBps float64 `json:"floor_gb_per_s"`
	Ratio     float64 `json:"ratio_to_floor"`
	// TCPGBps is plain TCP on loopback into memory (the bytes read and
	// dropped), measured in the same rounds (median): what loopback moves
	// when no file is written.
	TCPGBps float64 `json:"tcp_gb_per_s"`
	// RSSGrowth is how much this process (client and daemon) grew in
	// resident memory over the timed uploads, beyond the data buffer.
	RSSGrowth int64 `json:"rss_growth_bytes"`
	// Capped says how the session's writes are capped: "tmpfs" when the
	// daemon sandboxes it (its directory a tmpfs of the session's cap),
	// else "quota" (the daemon's count of its files).
	Capped string `json:"capped"`
	// UncappedGBps is the same uploads, in the same rounds, into a
	// session of a daemon without a sandbox and without a session quota
	// (median); CapCost is UncappedGBps / GBps, what the cap costs.
	UncappedGBps float64 `json:"uncapped_gb_per_s"`
	CapCost      float64 `json:"cap_cost"`
	Quick        bool    `json:"quick,omitempty"`
}

func (r uploadResult) Line() string {
	return fmt.Sprintf("upload: %d MiB to a device daemon on loopback at %.2f GB/s median, %.2f GB/s best (%.1f ms; goal ≥ %.1f GB/s; session capped by %s) over %d uploads; uncapped, unsandboxed session %.2f GB/s (cap cost ×%.2f); plain TCP into a file %.2f GB/s (ratio %.2f), into memory %.2f GB/s; RSS grew %d KiB",
		r.Bytes>>20, r.GBps, r.BestGBps, r.MedianMS, r.GoalGBps, r.Capped, r.Uploads, r.UncappedGBps, r.CapCost, r.FloorGBps, r.Ratio, r.TCPGBps, r.RSSGrowth>>10)
}

// runUpload uploads the same data several times into one session (each
// upload replaces the file) and reports the throughput.
func runUpload(ctx context.Context, opt options) (_ result, err error) {
	size, uploads := 64<<20, 7
	if opt.quick {
		size, uploads = 1<<20, 2
	}
	bd, err := startBenchDaemon(ctx)
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, bd.stop()) }()
	s, err := bd.connect(ctx)
	if err != nil {
		return nil, err
	}
	defer s.Close()
	// The same uploads without the cap: no sandbox (so no tmpfs) and no
	// session quota.
	bu, err := startBenchDaemon(ctx, func(c *rpcserver.Config) { c.Sandbox, c.SessionQuota = rpcserver.SandboxOff, -1 })
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, bu.stop()) }()
	su, err := bu.connect(ctx)
	if err != nil {
		return nil, err
	}
	defer su.Close()
	data := make([]byte, size)
	for i := range data {
		data[i] = byte(i*7 + i>>13)
	}
	// One upload to warm the connection and the daemon's buffers.
	for _, s := range []*client.Session{s, su} {
		if err := s.Upload(ctx, "artifact.kiln", data); err != nil {
			return nil, err
		}
	}
	floor, err := newTCPFloor(bd.dir)
	if err != nil {
		return nil, err
	}
	defer floor.close()
	// And one of each floor, so that its buffer is in memory too.
	for _, toFile := range []bool{true, false} {
		if _, err := floor.send(data, toFile); err != nil {
			return nil, err
		}
	}
	rss0 := rssBytes()
	secs := make([]float64, uploads)
	floorSecs := make([]float64, uploads)
	tcpSecs := make([]float64, uploads)
	uncappedSecs := make([]float64, uploads)
	for i := range secs {
		start := time.Now()
		if err := s.Upload(ctx, "artifact.kiln", data); err != nil {
			return nil, err
		}
		secs[i] = time.Since(start).Seconds()
		start = time.Now()
		if err := su.Upload(ctx, "artifact.kiln", data); err != nil {
			return nil, err
		}
		uncappedSecs[i] = time.Since(start).Seconds()
		if floorSecs[i], err = floor.send(data, true); err != nil {
			return nil, err
		}
		if tcpSecs[i], err = floor.send(data, false); err != nil {
			return nil, err
		}
	}
	growth := rssBytes() - rss0
	slices.Sort(secs)
	med := median(secs)
	floorMed := median(floorSecs)
	tcpMed := median(tcpSecs)
	r := uploadResult{
		Name: "upload", GBps: round(float64(size)/med/1e9, 3), BestGBps: round(float64(size)/secs[0]/1e9, 3),
		MedianMS: round(med*1e3, 2), Bytes: int64(size), Uploads: uploads, GoalGBps: uploadGoalGBps, Quick: opt.quick,
		FloorGBps: round(float64(size)/floorMed/1e9, 3), Ratio: round(floorMed/med, 3), RSSGrowth: growth,
		TCPGBps: round(float64(size)/tcpMed/1e9, 3),
	}
	r.UncappedGBps = round(float64(size)/median(uncappedSecs)/1e9, 3)
	r.CapCost = round(r.UncappedGBps/r.GBps, 3)
	r.Capped = "quota"
	if _, sandboxed := bd.d.Capacity(); sandboxed {
		r.Capped = "tmpfs"
	}
	r.MeetsGoal = r.GBps >= uploadGoalGBps
	return r, nil
}

// tcpFloor is plain TCP on loopback: a listener whose every connection is
// copied (spliced) into a new file of dir, or read into a buffer and
// dropped.
type tcpFloor struct {
	ln  net.Listener
	dir string
	buf []byte
}

func newTCPFloor(dir string) (*tcpFloor, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("tcp floor: %w", err)
	}
	return &tcpFloor{ln: ln, dir: dir, buf: make([]byte, 1<<20)}, nil
}

// send writes data over a fresh connection and returns the seconds until
// the receiver has it all in the file (toFile), or has read it all.
func (f *tcpFloor) send(data []byte, toFile bool) (float64, error) {
	done := make(chan error, 1)
	start := time.Now()
	go func() {
		c, err := f.ln.Accept()
		if err != nil {
			done <- err
			return
		}
		defer c.Close()
		if !toFile {
			var err error
			for left := len(data); left > 0 && err == nil; {
				var k int
				k, err = io.ReadFull(c, f.buf[:min(left, len(f.buf))])
				left -= k
			}
			done <- err
			return
		}
		out, err := os.CreateTemp(f.dir, "floor-")
		if err != nil {
			done <- err
			return
		}
		_, err = io.CopyN(out, c, int64(len(data)))
		out.Close()
		os.Remove(out.Name())
		done <- err
	}()
	c, err := net.Dial("tcp", f.ln.Addr().String())
	if err != nil {
		return 0, fmt.Errorf("tcp floor: %w", err)
	}
	_, werr := c.Write(data)
	c.Close()
	if err := <-done; err != nil {
		return 0, fmt.Errorf("tcp floor: %w", err)
	}
	if werr != nil {
		return 0, fmt.Errorf("tcp floor: %w", werr)
	}
	return time.Since(start).Seconds(), nil
}

func (f *tcpFloor) close() { f.ln.Close() }

// rssBytes is this process's resident memory (0 where /proc is absent).
func rssBytes() int64 {
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return 0
	}
	var size, rss int64
	fmt.Sscan(string(b), &size, &rss)
	return rss * int64(os.Getpagesize())
}
