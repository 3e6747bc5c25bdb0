package transform

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/compiler/interp"
	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/script"
	"github.com/kiln-ml/kiln/devices"
	_ "github.com/kiln-ml/kiln/devices/cpu" // host arrays for the interpreter
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/ndarray"
)

func parseFile(t *testing.T, path string) *ir.IRModule {
	t.Helper()
	src, err := os.ReadFile(path)
	check.NoError(t, err)
	m, err := script.Parse(filepath.Base(path), string(src))
	check.NoError(t, err)
	return m
}

// TestCompactBuffersGolden runs lower_init, lower_blocks and
// compact_buffers on each function of testdata/compact.py and compares
// the IR before and after compact_buffers with testdata/compact/NAME.golden.
func TestCompactBuffersGolden(t *testing.T) {
	m := parseFile(t, filepath.Join("testdata", "compact.py"))
	for name, f := range m.PrimFuncs() {
		t.Run(name, func(t *testing.T) {
			before, err := Run(f, []string{"lower_init", "lower_blocks"}, Options{Verify: true})
			check.NoError(t, err)
			after, err := Run(before, []string{"compact_buffers"}, Options{Verify: true})
			check.NoError(t, err)
			got := "# before compact_buffers\n" + script.Print(before) + "\n# after compact_buffers\n" + script.Print(after)
			path := filepath.Join("testdata", "compact", name+".golden")
			if *update {
				check.NoError(t, os.MkdirAll(filepath.Dir(path), 0o755))
				check.NoError(t, os.WriteFile(path, []byte(got), 0o644))
			}
			want, err := os.ReadFile(path)
			check.NoError(t, err, "run go test -update")
			check.Equal(t, got, string(want))
		})
	}
}

// TestCompactBuffersShapes checks the allocations compact_buffers leaves
// in each function of testdata/compact.py (the goldens show the same; this
// states the intent).
func TestCompactBuffersShapes(t *testing.T) {
	m := parseFile(t, filepath.Join("testdata", "compact.py"))
	tests := []struct {
		fn   string
		want []string // "name shape" of every allocation, outermost first
	}{
		{"fused_tile", []string{"C_local [4 8] in i_0_j_0_fused"}},
		{"packed_panel", []string{"B_global [4 8] in j_0", "C_local [4 8] in i_0"}},
		{"carried", []string{"t [4] in root"}},
		{"unit_batch", []string{"C_local [1 4 16] in i_0"}},
		{"symbolic", []string{"u [n 1] in root", "t [1 4] in i"}},
		{"threads", []string{"S [16] in bx", "L [1] in tx"}},
		// A thread's accumulator from one threadIdx nest to the next keeps
		// only that thread's elements.
		{"per_thread", []string{"L [1 1 2] in bx"}},
		// So does one inside a threadIdx.y loop (a warp's) used in its
		// threadIdx.x loops.
		{"per_thread_rows", []string{"L [1 1 1 2] in ty"}},
	}
	for _, tt := range tests {
		t.Run(tt.fn, func(t *testing.T) {
			f := m.PrimFunc(tt.fn)
			check.True(t, f != nil, "no function", tt.fn)
			g, err := Lower(f, Options{StopAfter: "compact_buffers", Verify: true})
			check.NoError(t, err)
			check.Equal(t, allocations(g.Body, "root"), tt.want)
		})
	}
}

// allocations lists "name [shape] in LOOP" for the allocations under s,
// LOOP being the innermost enclosing loop's variable (or where).
func allocations(s ir.Stmt, where string) []string {
	var out []string
	var walk func(s ir.Stmt, where string)
	walk = func(s ir.Stmt, where string) {
		ir.Visit(s, func(n ir.Node) bool {
			switch n := n.(type) {
			case *ir.For:
				walk(n.Body, n.Var.Name)
				return false
			case *ir.Allocate:
				shape := make([]string, len(n.Buffer.Shape))
				for i, e := range n.Buffer.Shape {
					shape[i] = e.String()
				}
				out = append(out, fmt.Sprintf("%s [%s] in %s", n.Buffer.Name, strings.Join(shape, " "), where))
			}
			return true
		})
	}
	walk(s, where)
	return out
}

// TestCompactBuffersDifferential runs scheduled functions (the schedule
// package's goldens and testdata/compact.py) on the reference interpreter
// as they are, lowered with compact_buffers and lowered without it, with
// fresh memory poisoned; every buffer must come out bit for bit the same.
func TestCompactBuffersDifferential(t *testing.T) {
	type input struct {
		name string
		f    *ir.PrimFunc
	}
	var inputs []input
	for name, f := range parseFile(t, filepath.Join("testdata", "compact.py")).PrimFuncs() {
		inputs = append(inputs, input{"compact/" + name, f})
	}
	goldens, err := filepath.Glob(filepath.Join("..", "schedule", "testdata", "*.golden"))
	check.NoError(t, err)
	check.True(t, len(goldens) > 0, "no schedule goldens")
	for _, path := range goldens {
		for name, f := range parseFile(t, path).PrimFuncs() {
			inputs = append(inputs, input{strings.TrimSuffix(filepath.Base(path), ".golden") + "/" + name, f})
		}
	}
	rng := rand.New(rand.NewPCG(3, 4))
	for _, in := range inputs {
		t.Run(in.name, func(t *testing.T) {
			with, err := Lower(in.f, Options{StopAfter: "storage_rewrite", Verify: true})
			check.NoError(t, err)
			without, err := Lower(in.f, Options{StopAfter: "storage_rewrite", Skip: []string{"compact_buffers"}, Verify: true})
			check.NoError(t, err)
			args := randomArgs(t, rng, in.f)
			var results [][][]byte
			for _, g := range []*ir.PrimFunc{in.f, with, without} {
				cp := copyArgs(t, args)
				check.NoError(t, interp.RunOptions(g, interp.Options{Poison: true, MaxSteps: 1 << 22}, cp...))
				results = append(results, argBytes(t, cp))
			}
			check.True(t, slices.EqualFunc(results[0], results[1], bytes.Equal), "compacted lowering differs from the function")
			check.True(t, slices.EqualFunc(results[0], results[2], bytes.Equal), "lowering without compaction differs from the function")
			if n, ok := totalAlloc(without.Body); ok {
				m, _ := totalAlloc(with.Body)
				check.True(t, m <= n, "compaction grew the allocations from", n, "to", m)
			}
		})
	}
}

// symbolicExtent is the value given to each shape variable.
const symbolicExtent = 5

// randomArgs makes one float32 array per buffer parameter of f, with
// normal values; shape variables get symbolicExtent.
func randomArgs(t *testing.T, rng *rand.Rand, f *ir.PrimFunc) []any {
	t.Helper()
	var args []any
	for _, p := range f.Params {
		b, ok := f.BufferMap[p]
		if !ok {
			t.Skipf("scalar parameter %q", p.Name)
		}
		check.True(t, b.DType == ir.Float32 || b.DType == ir.Float16, "parameter", b.Name, "is", b.DType, "(float32 and float16 are drawn)")
		shape := make(ndarray.Shape, len(b.Shape))
		for i, e := range b.Shape {
			switch e := e.(type) {
			case *ir.IntImm:
				shape[i] = e.Value
			case *ir.Var:
				shape[i] = symbolicExtent
			default:
				t.Skipf("buffer %q has extent %s", b.Name, e)
			}
		}
		if b.DType == ir.Float16 {
			// Finite halves of magnitude 0.25 to 4 (exponents 13 to 16),
			// any sign and mantissa.
			raw := make([]byte, 2*shape.NumElements())
			for i := 0; i < len(raw); i += 2 {
				h := uint16(rng.IntN(2))<<15 | uint16(13+rng.IntN(4))<<10 | uint16(rng.IntN(1<<10))
				raw[i], raw[i+1] = byte(h), byte(h>>8)
			}
			a, err := ndarray.FromBytes(raw, shape, ndarray.Float16, devices.CPUDevice)
			check.NoError(t, err)
			args = append(args, a)
			continue
		}
		data := make([]float32, shape.NumElements())
		for i := range data {
			data[i] = float32(rng.NormFloat64())
		}
		a, err := ndarray.FromSlice(data, shape)
		check.NoError(t, err)
		args = append(args, a)
	}
	return args
}

func copyArgs(t *testing.T, args []any) []any {
	t.Helper()
	out := make([]any, len(args))
	for i, a := range args {
		x := a.(*ndarray.NDArray)
		b, err := x.HostBytes()
		check.NoError(t, err)
		c, err := ndarray.FromBytes(slices.Clone(b), x.Shape(), x.DType(), devices.CPUDevice)
		check.NoError(t, err)
		out[i] = c
	}
	return out
}

func argBytes(t *testing.T, args []any) [][]byte {
	t.Helper()
	out := make([][]byte, len(args))
	for i, a := range args {
		b, err := a.(*ndarray.NDArray).HostBytes()
		check.NoError(t, err)
		out[i] = slices.Clone(b)
	}
	return out
}

// totalAlloc is the number of elements the allocations under s hold;
// false when one has a symbolic size.
func totalAlloc(s ir.Stmt) (int64, bool) {
	n, ok := int64(0), true
	ir.Visit(s, func(x ir.Node) bool {
		if a, isAlloc := x.(*ir.Allocate); isAlloc {
			c := constSize(a.Buffer)
			ok = ok && c >= 0
			n += max(c, 0)
		}
		return true
	})
	return n, ok
}
