package schedule

import (
	"encoding/binary"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/compiler/interp"
	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/te"
	"github.com/kiln-ml/kiln/devices"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/ndarray"
)

// halfDot returns C (float16, an intermediate) = A · B summed in float16
// for A: m×k and B: k×n of float16, and D = C as float32.
func halfDot(m, n, k int64) *ir.PrimFunc {
	A := te.Placeholder(te.Shape(m, k), ir.Float16, "A")
	B := te.Placeholder(te.Shape(k, n), ir.Float16, "B")
	r := te.ReduceAxis(ir.RangeFromExtent(ir.I32(k)), "k")
	C := te.Compute(te.Shape(m, n), func(i, j ir.Expr) ir.Expr {
		return te.Sum(ir.Mul(A.At(i, r), B.At(r, j)), r)
	}, "C")
	D := te.Compute(te.Shape(m, n), func(i, j ir.Expr) ir.Expr { return ir.NewCast(ir.Float32, C.At(i, j)) }, "D")
	return mustFunc(A, B, D)
}

func accumulateInFloat32(t *testing.T, s *Schedule) {
	c := must[BlockRV](t)(s.GetBlock("C"))
	ls := must[[]LoopRV](t)(s.GetLoops(c))
	cw := must[BlockRV](t)(s.CacheWriteDType(c, 0, "local", ir.Float32))
	check.NoError(t, s.ReverseComputeAt(cw, ls[1]))
}

// TestCacheWriteDType: the cache of a float16 sum holds float32, the sum
// is computed in it and rounded once by the copy back.
func TestCacheWriteDType(t *testing.T) {
	runCases(t, []schedCase{
		{name: "cache_write_dtype", fn: func() *ir.PrimFunc { return halfDot(4, 6, 8) }, apply: accumulateInFloat32},
	})
	// 2050 ones: float16 stops at 2048 (2048 + 1 rounds to even), float32
	// reaches 2050, which float16 holds.
	const k = 2050
	f := halfDot(1, 1, k)
	s, err := New(f)
	check.NoError(t, err)
	accumulateInFloat32(t, s)
	run := func(f *ir.PrimFunc) float32 {
		ones := func(shape ...int64) *ndarray.NDArray {
			a, err := ndarray.Empty(shape, ir.Float16, devices.CPUDevice)
			check.NoError(t, err)
			raw := make([]byte, 2*k)
			for i := range k {
				binary.LittleEndian.PutUint16(raw[2*i:], halfBits(1))
			}
			check.NoError(t, a.CopyFromBytes(raw))
			return a
		}
		d, err := ndarray.FromSlice([]float32{0}, ndarray.Shape{1, 1})
		check.NoError(t, err)
		check.NoError(t, interp.Run(f, ones(1, k), ones(k, 1), d))
		out, err := ndarray.ToSlice[float32](d)
		check.NoError(t, err)
		return out[0]
	}
	check.Equal(t, run(f), float32(2048))
	check.Equal(t, run(s.Func()), float32(2050))
}

func TestCacheWriteDTypeErrors(t *testing.T) {
	for _, c := range []struct {
		name string
		dt   ir.DType
		want string
	}{
		{"int", ir.Int32, `cache_write: a cache of "C" (float16) cannot hold int32: its dtype must be a wider one of the same kind`},
		{"bfloat16", ndarray.BFloat16, `cache_write: a cache of "C" (float16) cannot hold bfloat16: its dtype must be a wider one of the same kind`},
		{"none", ir.Void, `cache_write: no dtype for the cache`},
	} {
		t.Run(c.name, func(t *testing.T) {
			s, err := New(halfDot(4, 6, 8))
			check.NoError(t, err)
			b := must[BlockRV](t)(s.GetBlock("C"))
			_, err = s.CacheWriteDType(b, 0, "local", c.dt)
			check.Equal(t, err.Error(), c.want)
		})
	}
	s, err := New(matmul(8, 8, 4))
	check.NoError(t, err)
	b := must[BlockRV](t)(s.GetBlock("C"))
	_, err = s.CacheWriteDType(b, 0, "local", ir.Float16)
	check.Equal(t, err.Error(), `cache_write: a cache of "C" (float32) cannot hold float16: its dtype must be a wider one of the same kind`)
	_, err = Replay(matmul(8, 8, 4), []string{`b0 = sch.get_block("C")`, `b1 = sch.cache_write(b0, 0, "local", dtype="float65")`})
	check.True(t, err != nil && strings.Contains(err.Error(), "cache_write: dtype:"), "a bad dtype replays:", err)
}
