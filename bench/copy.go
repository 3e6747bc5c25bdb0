package main

import (
	"bytes"
	"context"
	"fmt"
	"time"

	"github.com/kiln-ml/kiln/devices"
	_ "github.com/kiln-ml/kiln/devices/cpu" // the CPU backend
	"github.com/kiln-ml/kiln/ndarray"
)

func init() {
	register(benchmark{
		name:    "copy",
		summary: "host-to-host NDArray.CopyFrom bandwidth against a Go copy() of the same bytes",
		run:     runCopy,
	})
}

// copyResult is the copy benchmark's report. GB/s counts 1e9 bytes copied
// (not read plus written) per second; each is the median over repeats, and
// a ratio is the median of the repeats' ndarray/memmove pairs. The headline
// figures are those of the largest size.
type copyResult struct {
	Name        string     `json:"name"`
	Bytes       int64      `json:"bytes"`
	NDArrayGBps float64    `json:"ndarray_gbps"`
	MemmoveGBps float64    `json:"memmove_gbps"`
	Ratio       float64    `json:"ratio"` // ndarray / memmove
	Repeats     int        `json:"repeats"`
	Sizes       []copySize `json:"sizes"`
	Quick       bool       `json:"quick,omitempty"`
}

// copySize is the measurement at one size.
type copySize struct {
	Bytes           int64   `json:"bytes"`
	CopiesPerSample int     `json:"copies_per_sample"`
	NDArrayGBps     float64 `json:"ndarray_gbps"`
	MemmoveGBps     float64 `json:"memmove_gbps"`
	Ratio           float64 `json:"ratio"`
}

func (r copyResult) Line() string {
	s := fmt.Sprintf("copy: ndarray/memmove %.3f", r.Ratio)
	for _, z := range r.Sizes {
		s += fmt.Sprintf("; %s: ndarray %.2f GB/s, memmove %.2f GB/s (ratio %.3f)", sizeName(z.Bytes), z.NDArrayGBps, z.MemmoveGBps, z.Ratio)
	}
	return s + fmt.Sprintf(" [median of %d]", r.Repeats)
}

func sizeName(n int64) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d B", n)
}

// runCopy times dst.CopyFrom(src) between two CPU NDArrays and a Go copy()
// between the same two buffers (through HostBytes), interleaved in one run
// so both see the same machine state, and reports the medians.
func runCopy(ctx context.Context, opt options) (result, error) {
	sizes, repeats, perSample := []int64{64 << 20, 1 << 20}, 21, int64(256<<20)
	if opt.quick {
		sizes, repeats, perSample = []int64{256 << 10, 4 << 10}, 3, 1<<20
	}
	r := copyResult{Name: "copy", Repeats: repeats, Quick: opt.quick}
	for _, n := range sizes {
		z, err := measureCopy(ctx, n, repeats, int(max(1, perSample/n)))
		if err != nil {
			return nil, err
		}
		r.Sizes = append(r.Sizes, z)
	}
	r.Bytes, r.NDArrayGBps, r.MemmoveGBps, r.Ratio = r.Sizes[0].Bytes, r.Sizes[0].NDArrayGBps, r.Sizes[0].MemmoveGBps, r.Sizes[0].Ratio
	return r, nil
}

func measureCopy(ctx context.Context, n int64, repeats, k int) (copySize, error) {
	src, err := ndarray.Empty(ndarray.Shape{n}, ndarray.Uint8, devices.CPUDevice)
	if err != nil {
		return copySize{}, err
	}
	defer src.Release()
	dst, err := ndarray.Empty(ndarray.Shape{n}, ndarray.Uint8, devices.CPUDevice)
	if err != nil {
		return copySize{}, err
	}
	defer dst.Release()
	sb, err := src.HostBytes()
	if err != nil {
		return copySize{}, err
	}
	db, err := dst.HostBytes()
	if err != nil {
		return copySize{}, err
	}
	for i := range sb {
		sb[i] = byte(i*7 + i>>8)
	}
	// Warm up both paths (and fault in dst's pages).
	copy(db, sb)
	clear(db)
	if err := dst.CopyFrom(src); err != nil {
		return copySize{}, fmt.Errorf("copy %d bytes: %w", n, err)
	}
	if !bytes.Equal(db, sb) {
		return copySize{}, fmt.Errorf("copy %d bytes: destination differs from source", n)
	}

	nd := make([]float64, 0, repeats)
	mm := make([]float64, 0, repeats)
	// Each sample starts with one untimed copy of its own kind, so it measures
	// that kind's steady state rather than what the other kind left in the
	// caches (glibc's memcpy and Go's memmove leave them differently).
	timeND := func() error {
		if err := dst.CopyFrom(src); err != nil {
			return fmt.Errorf("copy %d bytes: %w", n, err)
		}
		start := time.Now()
		for range k {
			if err := dst.CopyFrom(src); err != nil {
				return fmt.Errorf("copy %d bytes: %w", n, err)
			}
		}
		nd = append(nd, gbps(n*int64(k), time.Since(start)))
		return nil
	}
	timeMM := func() {
		copy(db, sb)
		start := time.Now()
		for range k {
			copy(db, sb)
		}
		mm = append(mm, gbps(n*int64(k), time.Since(start)))
	}
	for i := range repeats {
		if err := ctx.Err(); err != nil {
			return copySize{}, err
		}
		// Alternate which goes first so neither always follows the other.
		if i%2 == 0 {
			if err := timeND(); err != nil {
				return copySize{}, err
			}
			timeMM()
		} else {
			timeMM()
			if err := timeND(); err != nil {
				return copySize{}, err
			}
		}
	}
	// The ratio is the median of each repeat's pair, so a burst of load from
	// elsewhere on the machine shifts both sides of a pair together.
	ratios := make([]float64, len(nd))
	for i := range nd {
		ratios[i] = nd[i] / mm[i]
	}
	z := copySize{
		Bytes:           n,
		CopiesPerSample: k,
		NDArrayGBps:     round(median(nd), 2),
		MemmoveGBps:     round(median(mm), 2),
		Ratio:           round(median(ratios), 3),
	}
	return z, nil
}

func gbps(bytes int64, d time.Duration) float64 {
	if d <= 0 {
		d = 1
	}
	return float64(bytes) / d.Seconds() / 1e9
}
