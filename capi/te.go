package main

/*
#include <stdlib.h>
#include "support.h"
*/
import "C"

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/script"
	"github.com/kiln-ml/kiln/compiler/te"
	"github.com/kiln-ml/kiln/ndarray"
)

// teGraph is a tensor-expression computation as a binding sends it (the
// Python package's kiln.te): size variables, reduce axes and tensors by
// index, tensors in definition order (a stage reads only tensors before
// it), and the PrimFunc's arguments.
//
// Expressions are JSON arrays whose first element names the node:
//
//	["int", V, DTYPE]  ["float", V, DTYPE]   constants
//	["var", I]         size variable I
//	["axis", I]        reduce axis I
//	["index", D]       the enclosing stage's D-th index variable
//	["load", T, [E…]]  element of tensor T
//	["bin", OP, A, B]  OP: add sub mul div mod floordiv floormod min max eq ne lt le gt ge and or
//	["not", A]         ["cast", DTYPE, A]   ["select", C, T, F]
//	["call", NAME, [E…]]                    an intrinsic (exp, sqrt, …)
//	["reduce", KIND, SOURCE, [I…]]          KIND: sum max min, over reduce axes I…
type teGraph struct {
	Vars    []teVar    `json:"vars"`
	Axes    []teAxis   `json:"axes"`
	Tensors []teTensor `json:"tensors"`
	Args    []int      `json:"args"`
	Name    string     `json:"name"`
}

type teVar struct {
	Name  string `json:"name"`
	DType string `json:"dtype"`
}

type teAxis struct {
	Name   string          `json:"name"`
	Min    json.RawMessage `json:"min"`
	Extent json.RawMessage `json:"extent"`
}

type teTensor struct {
	Name  string            `json:"name"`
	DType string            `json:"dtype"` // placeholders
	Shape []json.RawMessage `json:"shape"`
	// A compute stage has Body (nil for a placeholder) and names its index
	// variables with AxisNames.
	AxisNames []string        `json:"axis_names"`
	Body      json.RawMessage `json:"body"`
}

// teDecoder turns a teGraph's expressions into compiler/te expressions.
type teDecoder struct {
	vars    []*ir.Var
	axes    []*te.Axis
	tensors []*te.Tensor
	index   []ir.Expr // the stage being defined's index variables
	depth   int
}

// maxExprDepth bounds the nesting of a decoded expression.
const maxExprDepth = 10000

// primFuncFromTE builds the PrimFunc of a tensor-expression graph in JSON
// (te.CreatePrimFunc), its global symbol the graph's name ("main" when
// empty).
func primFuncFromTE(src []byte) (*ir.PrimFunc, error) {
	var g teGraph
	dec := json.NewDecoder(strings.NewReader(string(src)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&g); err != nil {
		return nil, fmt.Errorf("tensor expression: bad JSON: %w", err)
	}
	d := &teDecoder{}
	for _, v := range g.Vars {
		t, err := parseDType(v.DType)
		if err != nil {
			return nil, fmt.Errorf("te.var %q: %w", v.Name, err)
		}
		if !ir.IsIndexType(t) {
			return nil, fmt.Errorf("te.var %q: dtype %s, want an integer", v.Name, t)
		}
		d.vars = append(d.vars, te.VarOf(v.Name, t))
	}
	for _, a := range g.Axes {
		lo, err := d.expr(a.Min)
		if err != nil {
			return nil, fmt.Errorf("te.reduce_axis %q: %w", a.Name, err)
		}
		ext, err := d.expr(a.Extent)
		if err != nil {
			return nil, fmt.Errorf("te.reduce_axis %q: %w", a.Name, err)
		}
		if !ir.IsIndexType(lo.DType()) || !ir.IsIndexType(ext.DType()) {
			return nil, fmt.Errorf("te.reduce_axis %q: range (%s, %s) is not an integer range", a.Name, lo, ext)
		}
		lo, ext = ir.Promote(lo, ext)
		d.axes = append(d.axes, te.ReduceAxis(ir.Range{Min: lo, Extent: ext}, a.Name))
	}
	for _, t := range g.Tensors {
		shape := make([]ir.Expr, len(t.Shape))
		for j, s := range t.Shape {
			e, err := d.expr(s)
			if err != nil {
				return nil, fmt.Errorf("tensor %q: shape: %w", t.Name, err)
			}
			shape[j] = e
		}
		if t.Body == nil {
			dt, err := parseDType(t.DType)
			if err != nil {
				return nil, fmt.Errorf("te.placeholder %q: %w", t.Name, err)
			}
			d.tensors = append(d.tensors, te.Placeholder(shape, dt, t.Name))
			continue
		}
		var bodyErr error
		out := te.Compute(shape, func(idx []ir.Expr) ir.Expr {
			d.index = idx
			defer func() { d.index = nil }()
			e, err := d.expr(t.Body)
			if err != nil {
				bodyErr = err
				return ir.I32(0)
			}
			return e
		}, t.Name, t.AxisNames...)
		if bodyErr != nil {
			return nil, fmt.Errorf("te.compute %q: %w", t.Name, bodyErr)
		}
		if err := out.Err(); err != nil {
			return nil, err
		}
		d.tensors = append(d.tensors, out)
	}
	args := make([]*te.Tensor, len(g.Args))
	for i, a := range g.Args {
		if a < 0 || a >= len(d.tensors) {
			return nil, fmt.Errorf("argument %d: no tensor %d (the graph has %d)", i, a, len(d.tensors))
		}
		args[i] = d.tensors[a]
	}
	f, err := te.CreatePrimFunc(args)
	if err != nil {
		return nil, err
	}
	if g.Name != "" {
		f = f.WithAttr(ir.AttrGlobalSymbol, g.Name)
	}
	return f, nil
}

func parseDType(s string) (ir.DType, error) {
	if s == "" {
		return ir.DType{}, errors.New("no dtype given")
	}
	t, err := ndarray.ParseDType(s)
	if err != nil {
		return ir.DType{}, err
	}
	return t, nil
}

var teBinaryOps = map[string]ir.BinaryOp{
	"add": ir.OpAdd, "sub": ir.OpSub, "mul": ir.OpMul, "div": ir.OpDiv, "mod": ir.OpMod,
	"floordiv": ir.OpFloorDiv, "floormod": ir.OpFloorMod, "min": ir.OpMin, "max": ir.OpMax,
	"eq": ir.OpEQ, "ne": ir.OpNE, "lt": ir.OpLT, "le": ir.OpLE, "gt": ir.OpGT, "ge": ir.OpGE,
	"and": ir.OpAnd, "or": ir.OpOr,
}

// expr decodes one expression.
func (d *teDecoder) expr(raw json.RawMessage) (ir.Expr, error) {
	d.depth++
	defer func() { d.depth-- }()
	if d.depth > maxExprDepth {
		return nil, fmt.Errorf("expression nested deeper than %d", maxExprDepth)
	}
	var node []json.RawMessage
	if err := json.Unmarshal(raw, &node); err != nil || len(node) == 0 {
		return nil, fmt.Errorf("bad expression %.60s: want a non-empty JSON array", raw)
	}
	var op string
	if err := json.Unmarshal(node[0], &op); err != nil {
		return nil, fmt.Errorf("bad expression %.60s: its first element is not a name", raw)
	}
	want := func(n int) error {
		if len(node) != n+1 {
			return fmt.Errorf("expression %q takes %d operands, got %d", op, n, len(node)-1)
		}
		return nil
	}
	index := func(i int, what string, n int) (int, error) {
		var k int
		if err := json.Unmarshal(node[i], &k); err != nil {
			return 0, fmt.Errorf("%s: bad index %s", op, node[i])
		}
		if k < 0 || k >= n {
			return 0, fmt.Errorf("%s: no %s %d (there are %d)", op, what, k, n)
		}
		return k, nil
	}
	list := func(i int) ([]ir.Expr, error) {
		var items []json.RawMessage
		if err := json.Unmarshal(node[i], &items); err != nil {
			return nil, fmt.Errorf("%s: operand %d is not a list", op, i)
		}
		out := make([]ir.Expr, len(items))
		for j, it := range items {
			e, err := d.expr(it)
			if err != nil {
				return nil, err
			}
			out[j] = e
		}
		return out, nil
	}
	operand := func(i int) (ir.Expr, error) { return d.expr(node[i]) }
	switch op {
	case "int", "float":
		if err := want(2); err != nil {
			return nil, err
		}
		var ds string
		if err := json.Unmarshal(node[2], &ds); err != nil {
			return nil, fmt.Errorf("%s: bad dtype %s", op, node[2])
		}
		t, err := parseDType(ds)
		if err != nil {
			return nil, fmt.Errorf("%s constant: %w", op, err)
		}
		if op == "int" {
			var v int64
			if err := json.Unmarshal(node[1], &v); err != nil {
				return nil, fmt.Errorf("int: bad value %s", node[1])
			}
			if t.IsFloat() {
				return ir.NewFloatImm(t, float64(v)), nil
			}
			return ir.NewIntImm(t, v), nil
		}
		var v float64
		if err := json.Unmarshal(node[1], &v); err != nil {
			return nil, fmt.Errorf("float: bad value %s", node[1])
		}
		if !t.IsFloat() {
			return nil, fmt.Errorf("float constant %v has dtype %s", v, t)
		}
		return ir.NewFloatImm(t, v), nil
	case "var":
		if err := want(1); err != nil {
			return nil, err
		}
		k, err := index(1, "size variable", len(d.vars))
		if err != nil {
			return nil, err
		}
		return d.vars[k], nil
	case "axis":
		if err := want(1); err != nil {
			return nil, err
		}
		k, err := index(1, "reduce axis", len(d.axes))
		if err != nil {
			return nil, err
		}
		return d.axes[k], nil
	case "index":
		if err := want(1); err != nil {
			return nil, err
		}
		if d.index == nil {
			return nil, errors.New("an index variable of a compute stage used outside its te.compute")
		}
		k, err := index(1, "index variable", len(d.index))
		if err != nil {
			return nil, err
		}
		return d.index[k], nil
	case "load":
		if err := want(2); err != nil {
			return nil, err
		}
		k, err := index(1, "tensor", len(d.tensors))
		if err != nil {
			return nil, err
		}
		idx, err := list(2)
		if err != nil {
			return nil, err
		}
		t := d.tensors[k]
		if len(idx) != t.NDim() {
			return nil, fmt.Errorf("tensor %q has %d dimensions, indexed with %d indices", t.Name, t.NDim(), len(idx))
		}
		for j, e := range idx {
			if !ir.IsIndexType(e.DType()) {
				return nil, fmt.Errorf("index %d of %q (%s) has dtype %s, want an integer", j, t.Name, e, e.DType())
			}
		}
		return t.At(idx...), nil
	case "bin":
		if err := want(3); err != nil {
			return nil, err
		}
		var name string
		if err := json.Unmarshal(node[1], &name); err != nil {
			return nil, fmt.Errorf("bin: bad operator %s", node[1])
		}
		bop, ok := teBinaryOps[name]
		if !ok {
			return nil, fmt.Errorf("bin: unknown operator %q", name)
		}
		a, err := operand(2)
		if err != nil {
			return nil, err
		}
		b, err := operand(3)
		if err != nil {
			return nil, err
		}
		return ir.Arith(bop, a, b), nil
	case "not":
		if err := want(1); err != nil {
			return nil, err
		}
		a, err := operand(1)
		if err != nil {
			return nil, err
		}
		return ir.LogicalNot(a), nil
	case "cast":
		if err := want(2); err != nil {
			return nil, err
		}
		var ds string
		if err := json.Unmarshal(node[1], &ds); err != nil {
			return nil, fmt.Errorf("cast: bad dtype %s", node[1])
		}
		t, err := parseDType(ds)
		if err != nil {
			return nil, fmt.Errorf("cast: %w", err)
		}
		a, err := operand(2)
		if err != nil {
			return nil, err
		}
		return ir.NewCast(t, a), nil
	case "select":
		if err := want(3); err != nil {
			return nil, err
		}
		c, err := operand(1)
		if err != nil {
			return nil, err
		}
		a, err := operand(2)
		if err != nil {
			return nil, err
		}
		b, err := operand(3)
		if err != nil {
			return nil, err
		}
		a, b = ir.Promote(a, b)
		if a.DType() != b.DType() {
			return nil, fmt.Errorf("select: branches have dtypes %s and %s", a.DType(), b.DType())
		}
		if c.DType() != ir.Bool {
			c = ir.NewCast(ir.Bool, c)
		}
		return ir.NewSelect(c, a, b), nil
	case "call":
		if err := want(2); err != nil {
			return nil, err
		}
		var name string
		if err := json.Unmarshal(node[1], &name); err != nil {
			return nil, fmt.Errorf("call: bad name %s", node[1])
		}
		in, ok := ir.Intrinsics[name]
		if !ok {
			return nil, fmt.Errorf("call: unknown intrinsic %q (kiln has %s)", name, strings.Join(ir.IntrinsicNames(), ", "))
		}
		args, err := list(2)
		if err != nil {
			return nil, err
		}
		if len(args) != in.Arity {
			return nil, fmt.Errorf("call: %s takes %d arguments, got %d", name, in.Arity, len(args))
		}
		return ir.CallIntrin(name, args...), nil
	case "reduce":
		if err := want(3); err != nil {
			return nil, err
		}
		var kind string
		if err := json.Unmarshal(node[1], &kind); err != nil {
			return nil, fmt.Errorf("reduce: bad kind %s", node[1])
		}
		src, err := operand(2)
		if err != nil {
			return nil, err
		}
		var ids []int
		if err := json.Unmarshal(node[3], &ids); err != nil {
			return nil, fmt.Errorf("reduce: bad axis list %s", node[3])
		}
		if len(ids) == 0 {
			return nil, fmt.Errorf("te.%s: no reduce axis given", kind)
		}
		axes := make([]*te.Axis, len(ids))
		for i, k := range ids {
			if k < 0 || k >= len(d.axes) {
				return nil, fmt.Errorf("te.%s: no reduce axis %d (there are %d)", kind, k, len(d.axes))
			}
			axes[i] = d.axes[k]
		}
		switch kind {
		case "sum":
			return te.Sum(src, axes...), nil
		case "max":
			return te.Max(src, axes...), nil
		case "min":
			return te.Min(src, axes...), nil
		}
		return nil, fmt.Errorf("reduce: unknown kind %q (want sum, max or min)", kind)
	}
	return nil, fmt.Errorf("unknown expression %q", op)
}

//export kiln_te_create_prim_func
func kiln_te_create_prim_func(graph *C.char, out **C.char) C.int {
	if out == nil {
		return fail(badArg("no place for the function's text (NULL)"), errArgument)
	}
	f, err := primFuncFromTE([]byte(gostr(graph)))
	if err != nil {
		return fail(badArg("%v", err), errArgument)
	}
	name, _ := f.Attrs[ir.AttrGlobalSymbol].(string)
	return outString(out, script.Print(ir.NewIRModule().With(name, f)))
}
