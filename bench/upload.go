package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"
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
	Quick     bool    `json:"quick,omitempty"`
}

func (r uploadResult) Line() string {
	return fmt.Sprintf("upload: %d MiB to a device daemon on loopback at %.2f GB/s median, %.2f GB/s best (%.1f ms; goal ≥ %.1f GB/s) over %d uploads",
		r.Bytes>>20, r.GBps, r.BestGBps, r.MedianMS, r.GoalGBps, r.Uploads)
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
	data := make([]byte, size)
	for i := range data {
		data[i] = byte(i*7 + i>>13)
	}
	// One upload to warm the connection and the daemon's buffers.
	if err := s.Upload(ctx, "artifact.kiln", data); err != nil {
		return nil, err
	}
	secs := make([]float64, uploads)
	for i := range secs {
		start := time.Now()
		if err := s.Upload(ctx, "artifact.kiln", data); err != nil {
			return nil, err
		}
		secs[i] = time.Since(start).Seconds()
	}
	slices.Sort(secs)
	med := median(secs)
	r := uploadResult{
		Name: "upload", GBps: round(float64(size)/med/1e9, 3), BestGBps: round(float64(size)/secs[0]/1e9, 3),
		MedianMS: round(med*1e3, 2), Bytes: int64(size), Uploads: uploads, GoalGBps: uploadGoalGBps, Quick: opt.quick,
	}
	r.MeetsGoal = r.GBps >= uploadGoalGBps
	return r, nil
}
