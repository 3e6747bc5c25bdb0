package ir_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/internal/check"
)

// matmul builds C[i, j] = sum_k A[i, k] * B[k, j] over n×n float32 buffers
// the way TVMScript spells it, with fresh variables each call.
func matmul(n int64, names ...string) *ir.PrimFunc {
	nm := func(i int, def string) string {
		if i < len(names) {
			return names[i]
		}
		return def
	}
	shape := []ir.Expr{ir.I64(n), ir.I64(n)}
	a := ir.NewBuffer(nm(0, "A"), ir.Float32, shape, "")
	b := ir.NewBuffer(nm(1, "B"), ir.Float32, shape, "")
	c := ir.NewBuffer(nm(2, "C"), ir.Float32, shape, "")
	i, j, k := ir.NewVar(nm(3, "i"), ir.Int64), ir.NewVar(nm(4, "j"), ir.Int64), ir.NewVar(nm(5, "k"), ir.Int64)
	vi, vj, vk := ir.NewVar("v_i", ir.Int64), ir.NewVar("v_j", ir.Int64), ir.NewVar("v_k", ir.Int64)
	blk := &ir.Block{
		Name: "matmul",
		IterVars: []ir.IterVar{
			{Var: vi, Dom: ir.RangeFromExtent(ir.I64(n)), Kind: ir.IterSpatial},
			{Var: vj, Dom: ir.RangeFromExtent(ir.I64(n)), Kind: ir.IterSpatial},
			{Var: vk, Dom: ir.RangeFromExtent(ir.I64(n)), Kind: ir.IterReduce},
		},
		Reads:  []ir.BufferRegion{ir.PointRegion(a, vi, vk), ir.PointRegion(b, vk, vj)},
		Writes: []ir.BufferRegion{ir.PointRegion(c, vi, vj)},
		Init:   c.Store(ir.F32(0), vi, vj),
		Body:   c.Store(ir.Add(c.Load(vi, vj), ir.Mul(a.Load(vi, vk), b.Load(vk, vj))), vi, vj),
	}
	realize := &ir.BlockRealize{IterValues: []ir.Expr{i, j, k}, Predicate: ir.BoolImm(true), Block: blk}
	body := ir.NewFor(i, ir.I64(0), ir.I64(n), ir.ForSerial,
		ir.NewFor(j, ir.I64(0), ir.I64(n), ir.ForSerial,
			ir.NewFor(k, ir.I64(0), ir.I64(n), ir.ForSerial, realize)))
	return ir.NewPrimFunc([]*ir.Buffer{a, b, c}, ir.NewRootBlock(body), map[string]any{ir.AttrNoAlias: true})
}

func TestVerifyWellFormed(t *testing.T) {
	check.NoError(t, ir.Verify(matmul(16)))
	m := ir.NewIRModule().With("matmul", matmul(8)).With("mm2", matmul(4))
	check.NoError(t, ir.VerifyModule(m))
	check.Equal(t, m.Names(), []string{"matmul", "mm2"})
}

func TestPromotion(t *testing.T) {
	x := ir.NewVar("x", ir.Float32)
	n := ir.NewVar("n", ir.Int64)
	i := ir.NewVar("i", ir.Int32)
	for _, tc := range []struct {
		name string
		e    ir.Expr
		want string
		dt   ir.DType
	}{
		{"const adopts var type", ir.Add(x, ir.I32(1)), "(x + T.float32(1.0))", ir.Float32},
		{"int const to int64", ir.Mul(n, ir.I32(2)), "(n * T.int64(2))", ir.Int64},
		{"narrow int widened", ir.Add(i, n), `(T.Cast("int64", i) + n)`, ir.Int64},
		{"int meets float", ir.Sub(i, x), `(T.Cast("float32", i) - x)`, ir.Float32},
		{"compare is bool", ir.LT(n, ir.I64(4)), "(n < T.int64(4))", ir.Bool},
		{"max", ir.Max(x, ir.F32(0)), "T.max(x, T.float32(0.0))", ir.Float32},
		{"intrinsic", ir.Exp(x), "T.exp(x)", ir.Float32},
		{"broadcast scalar", ir.Add(ir.NewRamp(n, ir.I64(1), 4), ir.I64(1)), "(T.Ramp(n, T.int64(1), 4) + T.Broadcast(T.int64(1), 4))", ir.Int64.WithLanes(4)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			check.Equal(t, tc.e.String(), tc.want)
			check.Equal(t, tc.e.DType(), tc.dt)
		})
	}
}

func TestStructuralEqual(t *testing.T) {
	a, b := matmul(16), matmul(16)
	check.True(t, a != b)
	check.True(t, ir.StructuralEqual(a, b), "two builds are equal")
	check.Equal(t, ir.StructuralHash(a), ir.StructuralHash(b))
	renamed := matmul(16, "X", "Y", "Z", "p", "q", "r")
	check.True(t, ir.StructuralEqual(a, renamed), "renaming keeps equality")
	check.Equal(t, ir.StructuralHash(a), ir.StructuralHash(renamed))
	other := matmul(32)
	check.True(t, !ir.StructuralEqual(a, other), "a changed constant breaks equality")
	check.True(t, ir.StructuralHash(a) != ir.StructuralHash(other))

	// x + y versus x + x: the bijection matters.
	x, y := ir.NewVar("x", ir.Int32), ir.NewVar("y", ir.Int32)
	check.True(t, !ir.StructuralEqual(ir.Add(x, y), ir.Add(x, x)))
	check.True(t, ir.StructuralEqual(ir.Add(x, y), ir.Add(y, x)), "free variables map by position")
	check.True(t, !ir.StructuralEqual(ir.NewVar("x", ir.Int32), ir.NewVar("x", ir.Int64)), "dtype counts")

	check.True(t, ir.Equal(ir.Add(x, ir.I32(1)), ir.Add(x, ir.I32(1))), "identity equality")
	check.True(t, !ir.Equal(ir.Add(x, ir.I32(1)), ir.Add(y, ir.I32(1))), "identity equality tells variables apart")

	m1 := ir.NewIRModule().With("f", a)
	m2 := ir.NewIRModule().With("f", b)
	m3 := ir.NewIRModule().With("g", b)
	check.True(t, ir.StructuralEqual(m1, m2))
	check.True(t, !ir.StructuralEqual(m1, m3), "function names count")
}

func TestRewriter(t *testing.T) {
	f := matmul(16)
	// Substitute nothing: the same tree comes back.
	check.True(t, ir.SubstituteFunc(f, map[*ir.Var]ir.Expr{}) == f)
	// Make the loop bodies parallel by rewriting the outermost For.
	count := 0
	body := ir.Transform(f.Body, nil, func(s ir.Stmt) ir.Stmt {
		if fr, ok := s.(*ir.For); ok && fr.Var.Name == "i" {
			c := *fr
			c.Kind = ir.ForParallel
			count++
			return &c
		}
		return s
	})
	check.Equal(t, count, 1)
	g := f.WithBody(body)
	check.NoError(t, ir.Verify(g))
	check.True(t, !ir.StructuralEqual(f, g))
	// The original is untouched.
	ir.Visit(f.Body, func(n ir.Node) bool {
		if fr, ok := n.(*ir.For); ok {
			check.Equal(t, fr.Kind, ir.ForSerial)
		}
		return true
	})
	// Symbolic shape substitution reaches the buffers.
	n := ir.NewVar("n", ir.Int64)
	a := ir.NewBuffer("A", ir.Float32, []ir.Expr{n}, "")
	i := ir.NewVar("i", ir.Int64)
	loop := ir.NewFor(i, ir.I64(0), n, ir.ForSerial, a.Store(ir.F32(1), i))
	h := ir.NewPrimFunc([]*ir.Buffer{a}, loop, nil)
	check.NoError(t, ir.Verify(h))
	s := ir.SubstituteFunc(h, map[*ir.Var]ir.Expr{n: ir.I64(8)})
	check.Equal(t, s.ParamBuffer(0).Shape[0].String(), "T.int64(8)")
	check.Equal(t, s.Body.(*ir.For).Extent.String(), "T.int64(8)")
	check.Equal(t, a.Shape[0].String(), "n")
}

func TestVerifyErrors(t *testing.T) {
	a := ir.NewBuffer("A", ir.Float32, []ir.Expr{ir.I64(4), ir.I64(4)}, "")
	b := ir.NewBuffer("B", ir.Int32, []ir.Expr{ir.I64(4)}, "")
	i, j := ir.NewVar("i", ir.Int64), ir.NewVar("j", ir.Int64)
	loop := func(v *ir.Var, body ir.Stmt) ir.Stmt { return ir.NewFor(v, ir.I64(0), ir.I64(4), ir.ForSerial, body) }
	reduceBlock := func(kind ir.ForKind, init, body func(vi, vk *ir.Var) ir.Stmt) ir.Stmt {
		vi, vk := ir.NewVar("vi", ir.Int64), ir.NewVar("vk", ir.Int64)
		blk := &ir.Block{Name: "red", IterVars: []ir.IterVar{
			{Var: vi, Dom: ir.RangeFromExtent(ir.I64(4)), Kind: ir.IterSpatial},
			{Var: vk, Dom: ir.RangeFromExtent(ir.I64(4)), Kind: ir.IterReduce}},
			Init: init(vi, vk), Body: body(vi, vk)}
		return ir.NewFor(i, ir.I64(0), ir.I64(4), kind, loop(j,
			&ir.BlockRealize{IterValues: []ir.Expr{i, j}, Predicate: ir.BoolImm(true), Block: blk}))
	}
	for _, tc := range []struct {
		name string
		body ir.Stmt
		want []string
	}{
		{"undefined variable", loop(i, a.Store(ir.F32(0), i, j)), []string{`function "f"`, `store to "A"`, `undefined variable "j"`}},
		{"index count", loop(i, a.Store(ir.F32(0), i)), []string{`store to "A" with 1 indices, buffer has 2 dimensions`}},
		{"load index count", loop(i, loop(j, a.Store(a.Load(i), i, j))), []string{`load from "A" with 1 indices`}},
		{"binary dtype mismatch", loop(i, loop(j, a.Store(ir.NewBinary(ir.OpAdd, a.Load(i, j), ir.I32(1)), i, j))),
			[]string{"dtype mismatch in Add", "float32", "int32"}},
		{"store dtype mismatch", loop(i, &ir.BufferStore{Buffer: b, Value: ir.F32(1), Indices: []ir.Expr{i}}),
			[]string{`storing T.float32(1.0) of dtype float32 into buffer "B" of dtype int32`}},
		{"duplicate definition", loop(i, loop(i, a.Store(ir.F32(0), i, i))), []string{`variable "i" defined twice`}},
		{"reduce var in init", reduceBlock(ir.ForSerial,
			func(vi, vk *ir.Var) ir.Stmt { return a.Store(ir.F32(0), vi, vk) },
			func(vi, vk *ir.Var) ir.Stmt { return a.Store(ir.F32(1), vi, ir.I64(0)) }),
			[]string{`block "red"`, `init)`, `reduction variable "vk" used outside a reduction context`}},
		{"reduce var indexes output", reduceBlock(ir.ForSerial,
			func(vi, vk *ir.Var) ir.Stmt { return a.Store(ir.F32(0), vi, ir.I64(0)) },
			func(vi, vk *ir.Var) ir.Stmt { return a.Store(ir.F32(1), vi, vk) }),
			[]string{`reduction variable "vk" indexes the store to "A"`}},
		{"reduce var bound to parallel loop", reduceBlock(ir.ForSerial,
			func(vi, vk *ir.Var) ir.Stmt { return a.Store(ir.F32(0), vi, ir.I64(0)) },
			func(vi, vk *ir.Var) ir.Stmt { return a.Store(ir.F32(1), vi, ir.I64(0)) }), nil},
		{"bad condition", loop(i, &ir.IfThenElse{Cond: i, Then: a.Store(ir.F32(0), i, i)}), []string{"if condition i has dtype int64, want bool"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := ir.NewPrimFunc([]*ir.Buffer{a, b}, tc.body, map[string]any{ir.AttrGlobalSymbol: "f"})
			err := ir.Verify(f)
			if tc.want == nil {
				check.NoError(t, err)
				return
			}
			check.Error(t, err, tc.want...)
			check.True(t, errors.Is(err, ir.ErrIllFormed))
		})
	}
	t.Run("reduce var bound to parallel loop", func(t *testing.T) {
		vi, vk := ir.NewVar("vi", ir.Int64), ir.NewVar("vk", ir.Int64)
		blk := &ir.Block{Name: "red", IterVars: []ir.IterVar{
			{Var: vi, Dom: ir.RangeFromExtent(ir.I64(4)), Kind: ir.IterSpatial},
			{Var: vk, Dom: ir.RangeFromExtent(ir.I64(4)), Kind: ir.IterReduce}},
			Init: b.Store(ir.I32(0), vi), Body: b.Store(ir.Add(b.Load(vi), ir.I32(1)), vi)}
		body := loop(i, ir.NewFor(j, ir.I64(0), ir.I64(4), ir.ForParallel,
			&ir.BlockRealize{IterValues: []ir.Expr{i, j}, Predicate: ir.BoolImm(true), Block: blk}))
		err := ir.Verify(ir.NewPrimFunc([]*ir.Buffer{b}, body, nil))
		check.Error(t, err, `function "prim_func": block "red"`, `reduction variable "vk" bound to parallel loop "j"`)
	})
}

func TestModuleOrder(t *testing.T) {
	m := ir.NewIRModule().With("b", matmul(2)).With("a", matmul(2)).With("c", matmul(2))
	m2 := m.With("a", matmul(4)).Without("b")
	check.Equal(t, m.Names(), []string{"b", "a", "c"})
	check.Equal(t, m2.Names(), []string{"a", "c"})
	var got []string
	for name := range m2.PrimFuncs() {
		got = append(got, name)
	}
	check.Equal(t, strings.Join(got, ","), "a,c")
	check.True(t, m2.GlobalVar("a") == m.GlobalVar("a"), "replacing keeps the GlobalVar")
	check.True(t, m2.GlobalVar("b") == nil)
}

func TestRewriteFirstOfSeq(t *testing.T) {
	x := ir.NewVar("x", ir.Int32)
	b := ir.NewBuffer("A", ir.Int32, []ir.Expr{ir.I32(2)}, "")
	s := ir.Seq(b.Store(x, ir.I32(0)), b.Store(ir.I32(1), ir.I32(1)))
	got := ir.Substitute(s, map[*ir.Var]ir.Expr{x: ir.I32(7)})
	first := got.(*ir.SeqStmt).Seq[0].(*ir.BufferStore)
	check.Equal(t, first.Value.String(), "7")
}
