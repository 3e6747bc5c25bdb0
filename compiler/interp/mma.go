package interp

import (
	"fmt"
	"math"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/ndarray"
)

// mmaFragments is one thread's part of a ptx_mma m16n8k16: its fragments
// of A (16×16), B (16×8) and C (16×8), as floats.
type mmaFragments struct {
	a [8]float32
	b [4]float32
	c [4]float32
}

// The fragment layout of mma.m16n8k16 with 16-bit operands and float32
// accumulators (PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating
// point type"): lane l of the warp is in group g = l/4 at position t = l%4.

// mmaA returns the row and column of A that element i (0-7) of lane l's
// fragment holds.
func mmaA(l, i int) (row, col int) {
	g, t := l/4, l%4
	row = g + 8*((i/2)%2)
	col = 2*t + i%2 + 8*(i/4)
	return row, col
}

// mmaB returns the row (k) and column of B that element i (0-3) of lane
// l's fragment holds.
func mmaB(l, i int) (row, col int) {
	g, t := l/4, l%4
	return 2*t + i%2 + 8*(i/2), g
}

// mmaC returns the row and column of C (and D) that element i (0-3) of
// lane l's fragment holds.
func mmaC(l, i int) (row, col int) {
	g, t := l/4, l%4
	return g + 8*(i/2), 2*t + i%2
}

// warpMma computes D = A·B + C for the fragments of the 32 lanes of a warp
// and returns each lane's fragment of D. Each element of D is its element
// of C plus the products over k in order, each product (exact in float32
// for 16-bit operands) added and rounded to float32 in turn; the tensor
// cores may round the sum differently.
func warpMma(lanes []*mmaFragments) [][4]float32 {
	var a [16][16]float32
	var b [16][8]float32
	var c [16][8]float32
	for l, f := range lanes {
		for i, v := range f.a {
			r, k := mmaA(l, i)
			a[r][k] = v
		}
		for i, v := range f.b {
			k, col := mmaB(l, i)
			b[k][col] = v
		}
		for i, v := range f.c {
			r, col := mmaC(l, i)
			c[r][col] = v
		}
	}
	out := make([][4]float32, len(lanes))
	for l := range lanes {
		for i := range 4 {
			r, col := mmaC(l, i)
			d := c[r][col]
			for k := range 16 {
				d += float32(a[r][k] * b[k][col]) // the conversion keeps the product rounded apart (no FMA)
			}
			out[l][i] = d
		}
	}
	return out
}

// mma runs a ptx_mma (ir.OpPtxMma) in the running thread: it reads the
// thread's fragments, waits for the other lanes of its warp (see
// lockstep) and stores its fragment of D over C.
func (m *machine) mma(e *ir.Call) error {
	if len(e.Args) != 13 {
		return fmt.Errorf("evaluate %s: ptx_mma takes 13 arguments", e)
	}
	str := func(i int) string {
		if s, ok := e.Args[i].(*ir.StringImm); ok {
			return s.Value
		}
		return ""
	}
	ab := str(3)
	var dt ir.DType
	switch ab {
	case "fp16":
		dt = ir.Float16
	case "bf16":
		dt = ndarray.BFloat16
	}
	if str(0) != "m16n8k16" || str(1) != "row" || str(2) != "col" || dt == ir.Void || str(4) != ab || str(5) != "fp32" {
		return fmt.Errorf("evaluate %s: only ptx_mma m16n8k16 row col of fp16 or bf16 into fp32 is supported", e)
	}
	if sat, ok := ir.IsConstInt(e.Args[12]); !ok || sat != 0 {
		return fmt.Errorf("evaluate %s: saturating ptx_mma is not supported", e)
	}
	if m.gpu.lane == nil {
		return fmt.Errorf("evaluate %s: ptx_mma outside a threadIdx.x loop", e)
	}
	var f mmaFragments
	if err := m.fragment(e, 6, dt, f.a[:], false); err != nil {
		return err
	}
	if err := m.fragment(e, 8, dt, f.b[:], false); err != nil {
		return err
	}
	if err := m.fragment(e, 10, ir.Float32, f.c[:], false); err != nil {
		return err
	}
	m.gpu.lane.yield <- shuffleCall{mma: &f, site: e}
	r, ok := <-m.gpu.lane.resume
	if !ok {
		return errAbandoned
	}
	return m.fragment(e, 10, ir.Float32, r.d[:], true)
}

// fragment reads (or, with write, writes) the elements vals of the
// fragment of argument i of ptx_mma e, as dtype dt: argument i is the
// fragment's data variable, or a vector load of its elements (see
// ir.PtxMmaFragments), and argument i+1 an element offset from there.
func (m *machine) fragment(e *ir.Call, i int, dt ir.DType, vals []float32, write bool) error {
	off, err := m.evalInt(e.Args[i+1], "fragment offset")
	if err != nil {
		return fmt.Errorf("evaluate %s: %w", e, err)
	}
	var mem *memory
	var name string
	size := int64(dt.Size())
	switch a := e.Args[i].(type) {
	case *ir.Var:
		name = a.Name
		if mem = m.mem[a]; mem == nil {
			return fmt.Errorf("evaluate %s: %q is not allocated", e, a.Name)
		}
		if mem.threads != nil {
			mem = m.threadCopy(mem)
		}
	case *ir.BufferLoad:
		name = a.Buffer.Name
		first, ok := ir.PtxMmaFragment(a, len(vals))
		if !ok {
			return fmt.Errorf("evaluate %s: argument %d is not a load of the %d elements of a fragment", e, i, len(vals))
		}
		if a.Buffer.DType != dt {
			return fmt.Errorf("evaluate %s: fragment %q holds %s, not %s", e, name, a.Buffer.DType, dt)
		}
		idx := make([]int64, len(first))
		for d, x := range first {
			if idx[d], err = m.evalInt(x, "fragment index"); err != nil {
				return fmt.Errorf("evaluate %s: %w", e, err)
			}
		}
		l, err := m.layoutOf(a.Buffer)
		if err != nil {
			return fmt.Errorf("evaluate %s: %w", e, err)
		}
		if last := len(idx) - 1; l.strides[last] != 1 || idx[last]+int64(len(vals)) > l.shape[last] {
			return fmt.Errorf("evaluate %s: the %d elements of fragment %q from %s are not consecutive in its last dimension", e, len(vals), name, fmtIndex(idx))
		}
		var byteOff int
		if mem, byteOff, err = m.address(a.Buffer, idx, "ptx_mma fragment"); err != nil {
			return fmt.Errorf("evaluate %s: %w", e, err)
		}
		off += int64(byteOff) / size
	default:
		return fmt.Errorf("evaluate %s: argument %d is not a buffer's data or a load of a fragment", e, i)
	}
	if mem.shared {
		return fmt.Errorf("evaluate %s: fragment %q is in shared memory, not in the thread's registers (local)", e, name)
	}
	if off < 0 || (off+int64(len(vals)))*size > int64(len(mem.data)) {
		return fmt.Errorf("evaluate %s: elements %d to %d of fragment %q %w of its %d bytes", e, off, off+int64(len(vals))-1, name, ErrOutOfBounds, len(mem.data))
	}
	for j := range vals {
		b := mem.data[(off+int64(j))*size:]
		if write {
			writeLane(dt, b, math.Float64bits(float64(vals[j])))
		} else {
			vals[j] = float32(math.Float64frombits(readLane(dt, b)))
		}
	}
	return nil
}
