package transform

import (
	"github.com/kiln-ml/kiln/compiler/ir"
)

// OpPattern is an operator pattern kind, TVM's OpPatternKind: fusion
// rules compare them by order.
type OpPattern int64

// Operator pattern kinds.
const (
	// PatternElemWise: every output element reads the inputs at the same
	// index.
	PatternElemWise OpPattern = 0
	// PatternBroadcast: inputs are read at a subsequence of the output's
	// indices.
	PatternBroadcast OpPattern = 1
	// PatternInjective: each output element reads input elements at
	// indices computed from the output's (transpose, reshape).
	PatternInjective OpPattern = 2
	// PatternCommReduce: a commutative reduction (sum, max).
	PatternCommReduce OpPattern = 3
	// PatternOutEWiseFusable: a complex operation (matmul, conv2d) whose
	// output elementwise operations can be fused into it.
	PatternOutEWiseFusable OpPattern = 4
	// PatternTuple builds a tuple.
	PatternTuple OpPattern = 7
	// PatternOpaque cannot be fused.
	PatternOpaque OpPattern = 8
)

// AnnotateTIROpPattern sets the attribute "op_pattern" (ir.AttrOpPattern,
// an int64 OpPattern) on every PrimFunc that does not have it, inferred
// from its TensorIR as TVM does: each block (but the root) with a single
// store is classified by comparing the store's indices with each load's
// (the same variables in order: elementwise; a subsequence, unit
// dimensions read at 0 skipped: broadcast; only variables of the store:
// injective); a block with reduction iterators is out-elementwise-fusable
// when its body is a multiply-accumulate (matmul, conv2d) or when a load
// mixes reduction and other indices (pooling), else a commutative
// reduction; anything else is opaque. A function takes the largest kind
// of its blocks.
func AnnotateTIROpPattern(mod *ir.IRModule) (*ir.IRModule, error) {
	out := mod
	for name, f := range mod.PrimFuncs() {
		if _, ok := f.Attrs[ir.AttrOpPattern]; ok {
			continue
		}
		out = out.With(name, f.WithAttr(ir.AttrOpPattern, int64(AnalyzeOpPattern(f))))
	}
	return out, nil
}

// AnalyzeOpPattern returns f's operator pattern (see AnnotateTIROpPattern).
func AnalyzeOpPattern(f *ir.PrimFunc) OpPattern {
	a := &patternAnalyzer{kind: PatternElemWise}
	a.stmt(f.Body)
	return a.kind
}

type patternAnalyzer struct {
	kind OpPattern
}

func (a *patternAnalyzer) stmt(s ir.Stmt) {
	ir.Visit(s, func(n ir.Node) bool {
		switch n := n.(type) {
		case *ir.Block:
			if n.Name == ir.RootBlockName {
				return true
			}
			a.block(n)
			return false
		case *ir.BufferStore:
			// A store outside any block (a non-TensorIR function).
			a.kind = PatternOpaque
			return false
		}
		return true
	})
}

func (a *patternAnalyzer) block(b *ir.Block) {
	var stores []*ir.BufferStore
	var loads []*ir.BufferLoad
	nested := false
	ir.Visit(b.Body, func(n ir.Node) bool {
		switch n := n.(type) {
		case *ir.Block:
			nested = true
			return false
		case *ir.BufferStore:
			stores = append(stores, n)
		case *ir.BufferLoad:
			loads = append(loads, n)
		}
		return true
	})
	if nested || len(stores) != 1 {
		if nested {
			a.stmt(b.Body)
		}
		if len(stores) != 1 {
			a.kind = PatternOpaque
		}
		return
	}
	store := stores[0]
	pair := PatternElemWise
	hasElemWise := false
	for _, l := range loads {
		switch {
		case isElemwise(store, l):
			hasElemWise = true
		case isBroadcast(store, l):
			pair = max(pair, PatternBroadcast)
		case isInjective(store, l):
			pair = max(pair, PatternInjective)
		default:
			pair = PatternOpaque
		}
		if pair == PatternOpaque {
			break
		}
	}
	if pair == PatternBroadcast && hasElemWise {
		pair = PatternElemWise
	}
	if pair != PatternOpaque {
		a.kind = max(a.kind, pair)
		return
	}
	var reduce []*ir.Var
	for _, iv := range b.IterVars {
		if iv.Kind == ir.IterReduce {
			reduce = append(reduce, iv.Var)
		}
	}
	if len(reduce) == 0 {
		a.kind = PatternOpaque
		return
	}
	if isFMA(store) {
		a.kind = max(a.kind, PatternOutEWiseFusable)
		return
	}
	for _, l := range loads {
		if !isPureReduce(reduce, l.Indices) {
			a.kind = max(a.kind, PatternOutEWiseFusable)
			return
		}
	}
	a.kind = max(a.kind, PatternCommReduce)
}

func sameExpr(a, b ir.Expr) bool {
	if a == b {
		return true
	}
	return ir.Equal(a, b)
}

func isElemwise(s *ir.BufferStore, l *ir.BufferLoad) bool {
	if len(s.Indices) != len(l.Indices) {
		return false
	}
	for i := range s.Indices {
		if !sameExpr(s.Indices[i], l.Indices[i]) {
			return false
		}
	}
	return true
}

func isBroadcast(s *ir.BufferStore, l *ir.BufferLoad) bool {
	j := 0
	for i, idx := range l.Indices {
		if i < len(l.Buffer.Shape) {
			if d, ok := ir.ConstDim(l.Buffer.Shape[i]); ok && d == 1 {
				if c, ok := ir.ConstDim(idx); ok && c == 0 {
					continue
				}
			}
		}
		for j < len(s.Indices) && !sameExpr(s.Indices[j], idx) {
			j++
		}
		if j == len(s.Indices) {
			return false
		}
	}
	return true
}

func isInjective(s *ir.BufferStore, l *ir.BufferLoad) bool {
	vars := map[*ir.Var]bool{}
	for _, idx := range s.Indices {
		v, ok := idx.(*ir.Var)
		if !ok {
			return false
		}
		vars[v] = true
	}
	ok := true
	for _, idx := range l.Indices {
		ir.PostOrderVisit(idx, func(n ir.Node) {
			if v, isVar := n.(*ir.Var); isVar && !vars[v] {
				ok = false
			}
		})
	}
	return ok
}

// isFMA reports a store of C[i] = C[i] + x * y (or x * y + C[i]).
func isFMA(s *ir.BufferStore) bool {
	add, ok := s.Value.(*ir.Binary)
	if !ok || add.Op != ir.OpAdd {
		return false
	}
	self := func(e ir.Expr) bool {
		l, ok := e.(*ir.BufferLoad)
		return ok && l.Buffer == s.Buffer && isElemwise(s, l)
	}
	mul := func(e ir.Expr) bool {
		m, ok := e.(*ir.Binary)
		return ok && m.Op == ir.OpMul
	}
	return self(add.A) && mul(add.B) || self(add.B) && mul(add.A)
}

// isPureReduce reports indices each of which either uses no reduction
// variable or is exactly one.
func isPureReduce(reduce []*ir.Var, indices []ir.Expr) bool {
	for _, idx := range indices {
		var found *ir.Var
		ir.PostOrderVisit(idx, func(n ir.Node) {
			if v, ok := n.(*ir.Var); ok {
				for _, r := range reduce {
					if r == v {
						found = r
					}
				}
			}
		})
		if found != nil && idx != ir.Expr(found) {
			return false
		}
	}
	return true
}
