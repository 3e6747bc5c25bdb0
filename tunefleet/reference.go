package tunefleet

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/tune"
	"github.com/kiln-ml/kiln/ndarray"
)

// reference is a workload's inputs and the unscheduled function's
// outputs.
type reference struct {
	params []param
	// dflt is the unscheduled function's median time on the device that
	// computed the reference (0 when it could not be timed).
	dflt float64
	// poison is 0xff bytes as many as the largest output has.
	poison []byte
}

type param struct {
	shape ndarray.Shape
	dtype ndarray.DType
	data  []byte // inputs: the values; outputs: the reference result
	out   bool
}

// reference draws the task's inputs and computes the reference result
// with the unscheduled function, once per workload.
func (r *Runner) reference(ctx context.Context, task *tune.Task) (*reference, error) {
	r.refMu.Lock()
	defer r.refMu.Unlock()
	r.mu.Lock()
	ref := r.refs[task.Workload.Hash]
	r.mu.Unlock()
	if ref != nil {
		return ref, nil
	}
	ref, err := newReference(task.Func)
	if err != nil {
		return nil, fmt.Errorf("fleet: %s: %w", task.Name, err)
	}
	art, res, err := r.buildJob(ctx, task, task.Func, 0)
	if err != nil {
		return nil, err
	}
	if art == nil {
		return nil, fmt.Errorf("fleet: %s: the unscheduled function does not build: %s", task.Name, res.Error)
	}
	d, err := r.acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("fleet: %s: %w", task.Name, err)
	}
	defer r.release(d)
	if err := r.ready(ctx, d); err != nil {
		return nil, fmt.Errorf("fleet: %s: %w", task.Name, err)
	}
	fn, err := r.load(ctx, d, task, ref, art)
	var outs [][]byte
	if err == nil {
		outs, err = call(ctx, d, ref, fn)
	}
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, fmt.Errorf("fleet: %s: the unscheduled function failed on %s: %w", task.Name, d.name, err)
	}
	k := 0
	for i := range ref.params {
		if ref.params[i].out {
			ref.params[i].data = outs[k]
			k++
		}
	}
	if !r.cfg.NoDefault {
		// One repeat: the unscheduled function is the slowest of all
		// (seconds a call for a large kernel), and its time is a figure
		// to compare with, never ranked.
		o := r.cfg.Time
		o.Repeat = 1
		if t, err := d.sess.TimeEvaluator(ctx, fn, o, d.args()...); err == nil {
			ref.dflt = t.Median
		}
	}
	r.mu.Lock()
	r.refs[task.Workload.Hash] = ref
	r.mu.Unlock()
	return ref, nil
}

// Prepare computes the task's reference result and times its
// unscheduled function (see Default), as the first Run does: a caller
// timing Runs calls it first.
func (r *Runner) Prepare(ctx context.Context, task *tune.Task) error {
	_, err := r.reference(ctx, task)
	return err
}

// Default returns the median time of the task's unscheduled function on
// the device that computed its reference (false before the task's first
// batch, or when it could not be timed).
func (r *Runner) Default(t *tune.Task) (float64, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	ref := r.refs[t.Workload.Hash]
	if ref == nil || ref.dflt <= 0 {
		return 0, false
	}
	return ref.dflt, true
}

// newReference draws inputs for f's parameters: uniform in [-1, 1) for
// floats, small integers otherwise. Outputs are the buffers its blocks
// write.
func newReference(f *ir.PrimFunc) (*reference, error) {
	written := map[*ir.Buffer]bool{}
	ir.Visit(f.Body, func(n ir.Node) bool {
		if b, ok := n.(*ir.Block); ok {
			for _, w := range b.Writes {
				written[w.Buffer] = true
			}
		}
		return true
	})
	rng := rand.New(rand.NewPCG(0x6b696c6e, 11))
	ref := &reference{}
	for i, p := range f.Params {
		b := f.BufferMap[p]
		if b == nil {
			return nil, fmt.Errorf("parameter %d (%q) is a scalar: tuning takes functions of buffers only", i, p.Name)
		}
		shape := make(ndarray.Shape, len(b.Shape))
		for d, e := range b.Shape {
			v, ok := ir.IsConstInt(e)
			if !ok {
				return nil, fmt.Errorf("buffer %q has the symbolic shape %v: tuning needs static shapes", b.Name, b.Shape)
			}
			shape[d] = v
		}
		dt := b.DType
		n := shape.NumElements()
		data := make([]byte, n*int64(dt.Size()))
		if !written[b] {
			if err := fill(rng, dt, data); err != nil {
				return nil, fmt.Errorf("buffer %q: %w", b.Name, err)
			}
		}
		ref.params = append(ref.params, param{shape: shape, dtype: dt, data: data, out: written[b]})
		if written[b] && len(data) > len(ref.poison) {
			ref.poison = bytes.Repeat([]byte{0xff}, len(data))
		}
	}
	return ref, nil
}

func fill(rng *rand.Rand, dt ndarray.DType, b []byte) error {
	switch {
	case dt == ndarray.Float32:
		for i := 0; i < len(b); i += 4 {
			binary.LittleEndian.PutUint32(b[i:], math.Float32bits(float32(rng.Float64()*2-1)))
		}
	case dt == ndarray.Float64:
		for i := 0; i < len(b); i += 8 {
			binary.LittleEndian.PutUint64(b[i:], math.Float64bits(rng.Float64()*2-1))
		}
	case dt.IsInt() && dt.Lanes == 1:
		sz := dt.Size()
		for i := 0; i < len(b); i += sz {
			b[i] = byte(rng.IntN(8))
		}
	default:
		return fmt.Errorf("dtype %s is not supported by the tuner's checks", dt)
	}
	return nil
}

// compareAt compares got with the reference's bytes from offset off (a
// whole number of elements, within the reference): within 1e-3 of the
// reference's magnitude (plus 1e-3) for floats, exactly for integers.
func compareAt(p param, off int, got []byte) string {
	want := p.data[off : off+len(got)]
	switch p.dtype {
	case ndarray.Float32, ndarray.Float64:
		sz := p.dtype.Size()
		for i := 0; i+sz <= len(got); i += sz {
			var g, w float64
			if sz == 4 {
				g = float64(math.Float32frombits(binary.LittleEndian.Uint32(got[i:])))
				w = float64(math.Float32frombits(binary.LittleEndian.Uint32(want[i:])))
			} else {
				g = math.Float64frombits(binary.LittleEndian.Uint64(got[i:]))
				w = math.Float64frombits(binary.LittleEndian.Uint64(want[i:]))
			}
			if !(math.Abs(g-w) <= 1e-3*(1+math.Abs(w))) && !(math.IsNaN(w) && math.IsNaN(g)) {
				return fmt.Sprintf("wrong result: element %d is %g, the reference says %g", (off+i)/sz, g, w)
			}
		}
	default:
		if i := firstDiff(got, want); i >= 0 {
			return fmt.Sprintf("wrong result: byte %d differs from the reference", off+i)
		}
	}
	return ""
}

// checker compares an output with the reference as its bytes arrive
// (an io.Writer for Array.CopyTo), so no copy of the output is kept:
// Result then says what compare would say of the whole.
type checker struct {
	p    param
	off  int    // bytes compared so far
	part []byte // the start of an element split between two writes
	n    int    // bytes written
	msg  string // the first mismatch
}

func newChecker(p param) *checker {
	return &checker{p: p, part: make([]byte, 0, p.dtype.Size())}
}

func (c *checker) Write(b []byte) (int, error) {
	n := len(b)
	c.n += n
	if c.msg != "" || c.n > len(c.p.data) {
		return n, nil
	}
	sz := max(c.p.dtype.Size(), 1)
	if len(c.part) > 0 {
		k := min(sz-len(c.part), len(b))
		c.part = append(c.part, b[:k]...)
		b = b[k:]
		if len(c.part) < sz {
			return n, nil
		}
		c.msg = compareAt(c.p, c.off, c.part)
		c.off += sz
		c.part = c.part[:0]
	}
	whole := len(b) / sz * sz
	if c.msg == "" {
		c.msg = compareAt(c.p, c.off, b[:whole])
	}
	c.off += whole
	c.part = append(c.part, b[whole:]...)
	return n, nil
}

// Result is the comparison's verdict: "" when the output matched.
func (c *checker) Result() string {
	if c.n != len(c.p.data) {
		return fmt.Sprintf("output has %d bytes, want %d", c.n, len(c.p.data))
	}
	return c.msg
}

func firstDiff(a, b []byte) int {
	for i := range a {
		if a[i] != b[i] {
			return i
		}
	}
	return -1
}
