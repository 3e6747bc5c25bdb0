package ir_test

import (
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/relax/op"
	"github.com/kiln-ml/kiln/internal/check"
)

func names(vs []*ir.RVar) string {
	s := make([]string, len(vs))
	for i, v := range vs {
		s[i] = v.Name
	}
	return strings.Join(s, ",")
}

func TestRVisit(t *testing.T) {
	f := mlp()
	var pre, post []string
	ir.RVisit(f, func(e ir.RExpr) bool {
		switch e := e.(type) {
		case *ir.Op:
			pre = append(pre, e.Name)
		case *ir.RVar:
			pre = append(pre, e.Name)
		}
		return true
	})
	check.Equal(t, strings.Join(pre, " "), "relax.permute_dims w relax.matmul x lv0 relax.add lv1 b relax.nn.relu lv2 gv")
	ir.RPostOrderVisit(f.Body, func(e ir.RExpr) {
		switch e.(type) {
		case *ir.RCall:
			post = append(post, "call")
		case *ir.SeqExpr:
			post = append(post, "seq")
		}
	})
	check.Equal(t, strings.Join(post, " "), "call call call call seq")
	// Returning false skips the children.
	n := 0
	ir.RVisit(f, func(e ir.RExpr) bool { n++; _, isCall := e.(*ir.RCall); return !isCall })
	check.Equal(t, n, 7) // function, seq, four calls, gv
}

func TestRMutator(t *testing.T) {
	f := mlp()
	relu := f.Body.Blocks[0].Bindings[3].(*ir.VarBinding)
	gelu := op.MustCall("relax.nn.gelu", relu.Value.(*ir.RCall).Args, nil)
	tests := []struct {
		name string
		m    *ir.RMutator
		want func(t *testing.T, g *ir.Function)
	}{
		{"identity", &ir.RMutator{}, func(t *testing.T, g *ir.Function) {
			check.True(t, g == f, "nothing changed, nothing copied")
		}},
		{"replace an operator", &ir.RMutator{Expr: func(e ir.RExpr) ir.RExpr {
			if c, ok := e.(*ir.RCall); ok && c.Op.(*ir.Op).Name == "relax.nn.relu" {
				return op.MustCall("relax.nn.gelu", c.Args, nil)
			}
			return e
		}}, func(t *testing.T, g *ir.Function) {
			check.True(t, g != f)
			check.Equal(t, g.Body.Blocks[0].Bindings[3].BoundValue().(*ir.RCall).Op.(*ir.Op).Name, "relax.nn.gelu")
			check.Equal(t, f.Body.Blocks[0].Bindings[3].BoundValue().(*ir.RCall).Op.(*ir.Op).Name, "relax.nn.relu", "input untouched")
			check.True(t, g.Body.Blocks[0].Bindings[0] == f.Body.Blocks[0].Bindings[0], "unchanged bindings shared")
		}},
		{"drop and forward", &ir.RMutator{Binding: func(b ir.Binding) []ir.Binding {
			// Drop relu: its users take lv2 instead.
			if b.BoundVar().Name == "gv" {
				return nil
			}
			return []ir.Binding{b}
		}}, nil},
		{"replace a variable", &ir.RMutator{Binding: func(b ir.Binding) []ir.Binding {
			if b.BoundVar().Name == "gv" {
				return []ir.Binding{&ir.VarBinding{Var: ir.NewRVar("out", gelu.Info), Value: gelu}}
			}
			return []ir.Binding{b}
		}}, func(t *testing.T, g *ir.Function) {
			check.NoError(t, ir.VerifyFunction("main", g, nil))
			check.Equal(t, g.Body.Body.(*ir.RVar).Name, "out", "the result follows the new variable")
		}},
		{"insert", &ir.RMutator{Binding: func(b ir.Binding) []ir.Binding {
			if b.BoundVar().Name != "lv0" {
				return []ir.Binding{b}
			}
			extra := ir.NewDataflowVar("extra", b.BoundVar().Info)
			return []ir.Binding{b, &ir.VarBinding{Var: extra, Value: b.BoundVar()}}
		}}, func(t *testing.T, g *ir.Function) {
			check.NoError(t, ir.VerifyFunction("main", g, nil))
			check.Equal(t, len(g.Body.Blocks[0].Bindings), 5)
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.name == "drop and forward" {
				lv2 := f.Body.Blocks[0].Bindings[2].BoundVar()
				tc.m.Subst = map[*ir.RVar]ir.RExpr{relu.Var: lv2}
				tc.want = func(t *testing.T, g *ir.Function) {
					check.Equal(t, len(g.Body.Blocks[0].Bindings), 3)
					check.True(t, g.Body.Body == ir.RExpr(lv2), "the result is forwarded")
				}
			}
			tc.want(t, tc.m.RewriteFunc(f))
		})
	}
}

func TestRMutatorDropsEmptyBlocks(t *testing.T) {
	f := mlp()
	g := (&ir.RMutator{Binding: func(ir.Binding) []ir.Binding { return nil },
		Subst: map[*ir.RVar]ir.RExpr{f.Body.Body.(*ir.RVar): f.Params[0]}}).RewriteFunc(f)
	check.Equal(t, len(g.Body.Blocks), 0)
	check.True(t, g.Body.Body == ir.RExpr(f.Params[0]))
}

func TestFreeRVars(t *testing.T) {
	f := mlp()
	check.Equal(t, names(ir.FreeRVars(f)), "", "a function closes over nothing")
	check.Equal(t, names(ir.FreeRVars(f.Body)), "w,x,b", "the body uses the parameters")
	call := f.Body.Blocks[0].Bindings[2].BoundValue()
	check.Equal(t, names(ir.FreeRVars(call)), "lv1,b")
}

func TestDefUse(t *testing.T) {
	f := mlp()
	du := ir.DefUseOf(f)
	check.Equal(t, names(du.Order), "lv0,lv1,lv2,gv")
	x, w := f.Params[0], f.Params[1]
	check.Equal(t, names(du.Users[x]), "lv1")
	check.Equal(t, names(du.Users[w]), "lv0")
	gv := f.Body.Body.(*ir.RVar)
	check.True(t, du.Results[gv] && du.Used(gv) && len(du.Users[gv]) == 0)
	check.True(t, du.Bindings[gv] == f.Body.Blocks[0].Bindings[3])
	// Uses inside an if count for the variable the if is bound to.
	c := ir.NewRVar("c", ir.TensorOfShape(ir.Bool))
	y := ir.NewRVar("y", ir.TensorOfShape(ir.Float32, 2))
	inner := ir.NewRVar("inner", y.Info)
	then := &ir.SeqExpr{Blocks: []*ir.BindingBlock{{Bindings: []ir.Binding{
		&ir.VarBinding{Var: inner, Value: op.MustCall("relax.exp", []ir.RExpr{y}, nil)}}}}, Body: inner}
	els := &ir.SeqExpr{Body: y}
	r := ir.NewRVar("r", y.Info)
	g := ir.NewFunction([]*ir.RVar{c, y}, &ir.SeqExpr{Blocks: []*ir.BindingBlock{{Bindings: []ir.Binding{
		&ir.VarBinding{Var: r, Value: ir.NewIf(c, then, els)}}}}, Body: r}, nil)
	check.NoError(t, ir.VerifyFunction("g", g, nil))
	du = ir.DefUseOf(g)
	check.Equal(t, names(du.Users[y]), "r,inner")
	check.Equal(t, names(du.Users[c]), "r")
	check.True(t, du.Results[inner] && du.Results[y] && du.Results[r])
}
