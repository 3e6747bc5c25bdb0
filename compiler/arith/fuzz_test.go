package arith

import (
	"encoding/binary"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/kiln-ml/kiln/compiler/interp"
	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/script"
)

// exprGen builds a random integer expression from fuzz bytes.
type exprGen struct {
	data  []byte
	pos   int
	t     ir.DType
	vars  []*ir.Var
	nodes int
}

func (g *exprGen) byte() byte {
	if g.pos >= len(g.data) {
		return 0
	}
	b := g.data[g.pos]
	g.pos++
	return b
}

func (g *exprGen) constant() ir.Expr {
	b := g.byte()
	var v int64
	switch b % 8 {
	case 0: // a large constant, to reach the dtype's limits
		var buf [8]byte
		for i := range buf {
			buf[i] = g.byte()
		}
		v = int64(binary.LittleEndian.Uint64(buf[:]))
	case 1:
		v = int64(int8(g.byte()))
	default:
		v = int64(b%16) - 4
	}
	return ir.NewIntImm(g.t, v) // wraps into t as a C constant would
}

func (g *exprGen) gen(depth int) ir.Expr {
	g.nodes++
	b := g.byte()
	if depth <= 0 || g.nodes > 40 || g.pos >= len(g.data) {
		if b%2 == 0 {
			return g.vars[int(b/2)%len(g.vars)]
		}
		return g.constant()
	}
	ops := []ir.BinaryOp{ir.OpAdd, ir.OpSub, ir.OpMul, ir.OpFloorDiv, ir.OpFloorMod, ir.OpDiv, ir.OpMod, ir.OpMin, ir.OpMax}
	switch k := int(b) % 16; {
	case k < 2:
		return g.vars[int(g.byte())%len(g.vars)]
	case k < 3:
		return g.constant()
	case k < 12:
		op := ops[int(g.byte())%len(ops)]
		x := g.gen(depth - 1)
		var y ir.Expr
		if (op == ir.OpFloorDiv || op == ir.OpFloorMod || op == ir.OpDiv || op == ir.OpMod) && g.byte()%4 != 0 {
			y = g.constant() // divisions mostly by constants, as in index math
		} else {
			y = g.gen(depth - 1)
		}
		return ir.NewBinary(op, x, y)
	case k < 14:
		cmp := []ir.BinaryOp{ir.OpLT, ir.OpLE, ir.OpEQ, ir.OpNE, ir.OpGT, ir.OpGE}[int(g.byte())%6]
		c := ir.NewBinary(cmp, g.gen(depth-1), g.gen(depth-1))
		if g.byte()%2 == 0 {
			return &ir.Select{Cond: c, True: g.gen(depth - 1), False: g.gen(depth - 1)}
		}
		return &ir.Cast{Type: g.t, Value: c}
	case k < 15:
		// A round trip through a narrower type: wraps.
		return &ir.Cast{Type: g.t, Value: &ir.Cast{Type: ir.Int8, Value: g.gen(depth - 1)}}
	}
	lv := ir.NewVar("l", g.t)
	g.vars = append(g.vars, lv)
	body := g.gen(depth - 1)
	g.vars = g.vars[:len(g.vars)-1]
	return &ir.Let{Var: lv, Value: g.gen(depth - 1), Body: body}
}

// fuzzVar is a variable with the range its values are drawn from.
type fuzzVar struct {
	v      *ir.Var
	lo, hi int64
	bound  bool
}

// FuzzSimplify checks that Simplify preserves the value of random integer
// expressions for random variable values within their ranges, that
// ConstIntBound contains every value, and that what CanProve claims holds.
func FuzzSimplify(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15})
	f.Add([]byte{3, 16, 40, 4, 64, 3, 0, 9, 8, 2, 4, 12, 0, 6, 4, 3, 1, 7, 2, 5})
	f.Add([]byte{1, 200, 7, 0, 3, 4, 44, 3, 8, 9, 2, 2, 1, 0, 7, 5, 3, 9, 16, 33, 7, 1})
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) < 8 || len(data) > 512 {
			return
		}
		types := []ir.DType{ir.Int32, ir.Int64, ir.Int8, ir.Int32}
		dt := types[int(data[0])%len(types)]
		var fvs []fuzzVar
		names := []string{"a", "b", "c", "d"}
		for i, name := range names {
			lo := int64(int8(data[1+i]))
			ext := int64(data[5+i%3]%64) + 1
			fv := fuzzVar{v: ir.NewVar(name, dt), lo: lo, hi: lo + ext - 1, bound: true}
			if i == 3 && dt != ir.Int64 {
				// d is unbounded: any value of the dtype.
				r := typeRange(dt)
				fv.lo, fv.hi, fv.bound = r.lo, r.hi, false
			}
			if dt == ir.Int8 {
				fv.lo, fv.hi = max(fv.lo, -128), min(fv.hi, 127)
			}
			fvs = append(fvs, fv)
		}
		g := &exprGen{data: data[8:], t: dt}
		for _, fv := range fvs {
			g.vars = append(g.vars, fv.v)
		}
		e := g.gen(5)
		an := NewAnalyzer()
		for _, fv := range fvs {
			if fv.bound {
				an.Bind(fv.v, ir.Range{Min: ir.NewIntImm(dt, fv.lo), Extent: ir.NewIntImm(dt, fv.hi-fv.lo+1)})
			}
		}
		s := an.Simplify(e)
		lo, hi := an.ConstIntBound(e)
		slo, shi := an.ConstIntBound(s)
		cond := ir.NewBinary(ir.OpLE, e, g.gen(2))
		proved := an.CanProve(cond)

		h := fnv.New64a()
		h.Write(data)
		rng := rand.New(rand.NewPCG(h.Sum64(), 7))
		for trial := range 24 {
			env := interp.Vars{}
			for _, fv := range fvs {
				var x int64
				switch {
				case trial == 0:
					x = fv.lo
				case trial == 1:
					x = fv.hi
				case fv.hi-fv.lo < math.MaxInt32:
					x = fv.lo + rng.Int64N(fv.hi-fv.lo+1)
				default:
					x = int64(int32(rng.Uint32()))
				}
				env[fv.v] = interp.Int(dt, x)
			}
			want, err := interp.Eval(e, env)
			if err != nil {
				continue // division by zero in the original: nothing to compare
			}
			got, err := interp.Eval(s, env)
			if err != nil {
				t.Fatalf("simplified fails where the original does not\n  in:  %s\n  out: %s\n  env: %v\n  err: %v", script.Print(e), script.Print(s), env, err)
			}
			if !got.Equal(want) {
				t.Fatalf("simplify changed the value\n  in:  %s = %s\n  out: %s = %s\n  env: %v", script.Print(e), want, script.Print(s), got, env)
			}
			if v := want.AsInt(); v < lo || v > hi || v < slo || v > shi {
				t.Fatalf("bound [%d, %d] (simplified [%d, %d]) misses %d\n  in:  %s\n  env: %v", lo, hi, slo, shi, v, script.Print(e), env)
			}
			if proved {
				c, err := interp.Eval(cond, env)
				if err == nil && !c.AsBool() {
					t.Fatalf("CanProve(%s) but it is false for %v", script.Print(cond), env)
				}
			}
		}
	})
}
