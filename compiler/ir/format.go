package ir

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// This file prints expressions for messages and test failures. The
// canonical text format is compiler/script's printer.

var binarySymbols = map[BinaryOp]string{
	OpAdd: "+", OpSub: "-", OpMul: "*", OpDiv: "/", OpFloorDiv: "//", OpFloorMod: "%",
	OpEQ: "==", OpNE: "!=", OpLT: "<", OpLE: "<=", OpGT: ">", OpGE: ">=", OpAnd: "and", OpOr: "or",
}

// Symbol returns the Python operator of op ("+", "//", "and"…) or "" for
// operators written as calls (Mod, Min, Max).
func (op BinaryOp) Symbol() string { return binarySymbols[op] }

// FormatFloat prints f the way TVMScript does: always with a decimal point
// or exponent, "inf"/"nan" spelled as Python floats.
func FormatFloat(f float64) string {
	switch {
	case math.IsInf(f, 1):
		return `"inf"`
	case math.IsInf(f, -1):
		return `"-inf"`
	case math.IsNaN(f):
		return `"nan"`
	}
	s := strconv.FormatFloat(f, 'g', -1, 64)
	if !strings.ContainsAny(s, ".eEn") {
		s += ".0"
	}
	return s
}

// String prints the constant as TVMScript does.
func (e *IntImm) String() string {
	switch {
	case IsBool(e.Type):
		if e.Value != 0 {
			return "T.bool(True)"
		}
		return "T.bool(False)"
	case e.Type == Int32:
		return strconv.FormatInt(e.Value, 10)
	}
	return fmt.Sprintf("T.%s(%d)", e.Type, e.Value)
}

// String prints the constant as TVMScript does.
func (e *FloatImm) String() string { return fmt.Sprintf("T.%s(%s)", e.Type, FormatFloat(e.Value)) }

// String prints the quoted string.
func (e *StringImm) String() string { return strconv.Quote(e.Value) }

// String is the variable's name.
func (e *Var) String() string { return e.Name }

// String prints the operation.
func (e *Binary) String() string {
	if s := e.Op.Symbol(); s != "" {
		return fmt.Sprintf("(%s %s %s)", e.A, s, e.B)
	}
	name := map[BinaryOp]string{OpMod: "truncmod", OpMin: "min", OpMax: "max"}[e.Op]
	return fmt.Sprintf("T.%s(%s, %s)", name, e.A, e.B)
}

// String prints the negation.
func (e *Not) String() string { return fmt.Sprintf("not %s", e.A) }

// String prints the cast.
func (e *Cast) String() string { return fmt.Sprintf("T.Cast(%q, %s)", e.Type.String(), e.Value) }

// String prints the select.
func (e *Select) String() string {
	return fmt.Sprintf("T.Select(%s, %s, %s)", e.Cond, e.True, e.False)
}

// String prints the load.
func (e *BufferLoad) String() string { return e.Buffer.Name + "[" + joinExprs(e.Indices) + "]" }

// String prints the call.
func (e *Call) String() string {
	if e.Op == OpCallExtern {
		return fmt.Sprintf("T.call_extern(%q, %s)", e.Type.String(), joinExprs(e.Args))
	}
	return fmt.Sprintf("T.%s(%s)", e.Op, joinExprs(e.Args))
}

// String prints the ramp.
func (e *Ramp) String() string { return fmt.Sprintf("T.Ramp(%s, %s, %d)", e.Base, e.Stride, e.Lanes) }

// String prints the broadcast.
func (e *Broadcast) String() string { return fmt.Sprintf("T.Broadcast(%s, %d)", e.Value, e.Lanes) }

// String prints the let.
func (e *Let) String() string { return fmt.Sprintf("T.Let(%s, %s, %s)", e.Var, e.Value, e.Body) }

func joinExprs(es []Expr) string {
	parts := make([]string, len(es))
	for i, e := range es {
		if e == nil {
			parts[i] = "<nil>"
		} else {
			parts[i] = e.String()
		}
	}
	return strings.Join(parts, ", ")
}

// Describe names a statement for messages: `for "i"`, `block "matmul"`,
// `store to "C"`…
func Describe(s Stmt) string {
	switch s := s.(type) {
	case *For:
		return fmt.Sprintf("for %q", s.Var.Name)
	case *BlockRealize:
		return fmt.Sprintf("block %q", s.Block.Name)
	case *BufferStore:
		return fmt.Sprintf("store to %q", s.Buffer.Name)
	case *Allocate:
		return fmt.Sprintf("allocate %q", s.Buffer.Name)
	case *DeclBuffer:
		return fmt.Sprintf("decl_buffer %q", s.Buffer.Name)
	case *SeqStmt:
		return "sequence"
	case *IfThenElse:
		return fmt.Sprintf("if %s", s.Cond)
	case *LetStmt:
		return fmt.Sprintf("let %q", s.Var.Name)
	case *Evaluate:
		return fmt.Sprintf("evaluate %s", s.Value)
	case *AttrStmt:
		return fmt.Sprintf("attr %q", s.Key)
	case *AssertStmt:
		return fmt.Sprintf("assert %s", s.Cond)
	case nil:
		return "<nil>"
	}
	return fmt.Sprintf("%T", s)
}
