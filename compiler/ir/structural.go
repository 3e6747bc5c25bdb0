package ir

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"math"
	"slices"
	"sort"
)

// Structural equality compares IR up to the renaming of variables and
// buffers: each variable and buffer is numbered by the position of its
// first occurrence (its definition in well-formed IR), and two nodes are
// equal when their trees match with the same numbering. Names of
// variables, buffers and parameters do not count; block names, function
// names in a module, attributes and constants do.
//
// Both functions serialize a node to a canonical byte string, so equal
// nodes always hash alike and the hash is stable across processes (it keys
// the build cache).

// StructuralEqual reports whether a and b are equal up to renaming.
func StructuralEqual(a, b Node) bool {
	return bytes.Equal(structuralBytes(a), structuralBytes(b))
}

// StructuralHash returns a hash of n consistent with StructuralEqual and
// stable across processes and versions of Go.
func StructuralHash(n Node) uint64 {
	h := fnv.New64a()
	h.Write(structuralBytes(n))
	return h.Sum64()
}

// Equal reports whether a and b are the same tree with the same variables
// and buffers (compared by identity, not renamed): x+1 equals x+1 only for
// the same x. Simplifiers use it to match patterns like (a + b) - a.
func Equal(a, b Node) bool {
	shared := &identity{vars: map[*Var]int{}, bufs: map[*Buffer]int{}, rvars: map[*RVar]int{}}
	wa := &StructuralWriter{id: shared}
	wa.Node(a)
	wb := &StructuralWriter{id: shared}
	wb.Node(b)
	return bytes.Equal(wa.buf, wb.buf)
}

// identity numbers variables and buffers by pointer across writers.
type identity struct {
	vars  map[*Var]int
	bufs  map[*Buffer]int
	rvars map[*RVar]int
}

func structuralBytes(n Node) []byte {
	w := &StructuralWriter{}
	w.Node(n)
	return w.buf
}

// Structural is implemented by nodes defined outside this package (such as
// graph-level functions) so that StructuralEqual and StructuralHash cover
// them. WriteStructure writes the node's parts, in a fixed order, to w.
type Structural interface {
	WriteStructure(w *StructuralWriter)
}

// StructuralWriter accumulates the canonical form of a node.
type StructuralWriter struct {
	id    *identity // set by Equal: variables and buffers by identity
	buf   []byte
	vars  map[*Var]int
	bufs  map[*Buffer]int
	rvars map[*RVar]int // graph-level variables (relax_structural.go)
}

// Tag writes a string (a node kind, a name or a key).
func (w *StructuralWriter) Tag(s string) {
	w.buf = binary.AppendUvarint(w.buf, uint64(len(s)))
	w.buf = append(w.buf, s...)
}

// Int writes an integer.
func (w *StructuralWriter) Int(v int64) { w.buf = binary.AppendVarint(w.buf, v) }

// DType writes a dtype.
func (w *StructuralWriter) DType(t DType) {
	w.buf = append(w.buf, byte(t.Code), t.Bits, byte(t.Lanes), byte(t.Lanes>>8))
}

// Var writes a variable: its number, and its dtype at its first occurrence.
func (w *StructuralWriter) Var(v *Var) {
	if v == nil {
		w.Tag("nil")
		return
	}
	if w.id != nil {
		i, ok := w.id.vars[v]
		if !ok {
			i = len(w.id.vars)
			w.id.vars[v] = i
		}
		w.Tag("v")
		w.Int(int64(i))
		return
	}
	if i, ok := w.vars[v]; ok {
		w.Tag("v")
		w.Int(int64(i))
		return
	}
	if w.vars == nil {
		w.vars = map[*Var]int{}
	}
	i := len(w.vars)
	w.vars[v] = i
	w.Tag("vdef")
	w.Int(int64(i))
	w.DType(v.Type)
}

// Buffer writes a buffer: its number, and its fields at its first
// occurrence.
func (w *StructuralWriter) Buffer(b *Buffer) {
	if b == nil {
		w.Tag("nil")
		return
	}
	if w.id != nil {
		i, ok := w.id.bufs[b]
		if !ok {
			i = len(w.id.bufs)
			w.id.bufs[b] = i
		}
		w.Tag("b")
		w.Int(int64(i))
		return
	}
	if i, ok := w.bufs[b]; ok {
		w.Tag("b")
		w.Int(int64(i))
		return
	}
	if w.bufs == nil {
		w.bufs = map[*Buffer]int{}
	}
	i := len(w.bufs)
	w.bufs[b] = i
	w.Tag("bdef")
	w.Int(int64(i))
	w.DType(b.DType)
	w.Tag(b.StorageScope())
	w.Var(b.Data)
	w.exprs(b.Shape)
	w.exprs(b.Strides)
	if b.ElemOffset == nil {
		w.Node(I64(0))
	} else if c, ok := b.ElemOffset.(*IntImm); ok && c.Value == 0 {
		w.Node(I64(0))
	} else {
		w.Node(b.ElemOffset)
	}
}

func (w *StructuralWriter) exprs(es []Expr) {
	w.Int(int64(len(es)))
	for _, e := range es {
		w.Node(e)
	}
}

func (w *StructuralWriter) stmt(s Stmt) {
	if s == nil {
		w.Tag("nil")
		return
	}
	w.Node(s)
}

func (w *StructuralWriter) rng(r Range) {
	w.Node(r.Min)
	w.Node(r.Extent)
}

func (w *StructuralWriter) regions(rs []BufferRegion) {
	w.Int(int64(len(rs)))
	for _, r := range rs {
		w.Buffer(r.Buffer)
		w.Int(int64(len(r.Region)))
		for _, rg := range r.Region {
			w.rng(rg)
		}
	}
}

// Attrs writes an attribute map, keys sorted.
func (w *StructuralWriter) Attrs(m map[string]any) {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	w.Int(int64(len(keys)))
	for _, k := range keys {
		w.Tag(k)
		w.Value(m[k])
	}
}

// Value writes an attribute value.
func (w *StructuralWriter) Value(v any) {
	switch v := v.(type) {
	case nil:
		w.Tag("none")
	case bool:
		w.Tag("bool")
		if v {
			w.Int(1)
		} else {
			w.Int(0)
		}
	case int:
		w.Tag("i")
		w.Int(int64(v))
	case int64:
		w.Tag("i")
		w.Int(v)
	case float64:
		w.Tag("f")
		w.Int(int64(math.Float64bits(v)))
	case string:
		w.Tag("s")
		w.Tag(v)
	case []any:
		w.Tag("list")
		w.Int(int64(len(v)))
		for _, x := range v {
			w.Value(x)
		}
	case map[string]any:
		w.Tag("map")
		w.Attrs(v)
	default:
		w.Node(v)
	}
}

// Node writes any node.
func (w *StructuralWriter) Node(n Node) {
	switch n := n.(type) {
	case nil:
		w.Tag("nil")
	case *IntImm:
		w.Tag("int")
		w.DType(n.Type)
		w.Int(n.Value)
	case *FloatImm:
		w.Tag("float")
		w.DType(n.Type)
		w.Int(int64(math.Float64bits(n.Value)))
	case *StringImm:
		w.Tag("str")
		w.Tag(n.Value)
	case *Var:
		w.Var(n)
	case *Binary:
		w.Tag("bin")
		w.Int(int64(n.Op))
		w.Node(n.A)
		w.Node(n.B)
	case *Not:
		w.Tag("not")
		w.Node(n.A)
	case *Cast:
		w.Tag("cast")
		w.DType(n.Type)
		w.Node(n.Value)
	case *Select:
		w.Tag("select")
		w.Node(n.Cond)
		w.Node(n.True)
		w.Node(n.False)
	case *BufferLoad:
		w.Tag("load")
		w.Buffer(n.Buffer)
		w.exprs(n.Indices)
	case *Call:
		w.Tag("call")
		w.DType(n.Type)
		w.Tag(n.Op)
		w.exprs(n.Args)
	case *Ramp:
		w.Tag("ramp")
		w.Node(n.Base)
		w.Node(n.Stride)
		w.Int(int64(n.Lanes))
	case *Broadcast:
		w.Tag("broadcast")
		w.Node(n.Value)
		w.Int(int64(n.Lanes))
	case *Let:
		w.Tag("let")
		w.Node(n.Value)
		w.Var(n.Var)
		w.Node(n.Body)
	case *For:
		w.Tag("for")
		w.Var(n.Var)
		w.Node(n.Min)
		w.Node(n.Extent)
		w.Int(int64(n.Kind))
		w.Tag(n.ThreadTag)
		w.Attrs(n.Annotations)
		w.stmt(n.Body)
	case *BlockRealize:
		w.Tag("realize")
		w.exprs(n.IterValues)
		if n.Predicate == nil {
			w.Node(BoolImm(true))
		} else {
			w.Node(n.Predicate)
		}
		w.Node(n.Block)
	case *Block:
		w.Tag("block")
		w.Tag(n.Name)
		w.Int(int64(len(n.IterVars)))
		for _, iv := range n.IterVars {
			w.Var(iv.Var)
			w.rng(iv.Dom)
			w.Int(int64(iv.Kind))
		}
		w.Int(int64(len(n.AllocBuffers)))
		for _, b := range n.AllocBuffers {
			w.Buffer(b)
		}
		w.regions(n.Reads)
		w.regions(n.Writes)
		w.stmt(n.Init)
		w.stmt(n.Body)
		w.Attrs(n.Annotations)
	case *BufferStore:
		w.Tag("store")
		w.Buffer(n.Buffer)
		w.exprs(n.Indices)
		w.Node(n.Value)
	case *Allocate:
		w.Tag("allocate")
		w.Buffer(n.Buffer)
		w.stmt(n.Body)
	case *DeclBuffer:
		w.Tag("declbuffer")
		w.Buffer(n.Buffer)
		w.stmt(n.Body)
	case *SeqStmt:
		w.Tag("seq")
		w.Int(int64(len(n.Seq)))
		for _, s := range n.Seq {
			w.stmt(s)
		}
	case *IfThenElse:
		w.Tag("if")
		w.Node(n.Cond)
		w.stmt(n.Then)
		w.stmt(n.Else)
	case *LetStmt:
		w.Tag("letstmt")
		w.Node(n.Value)
		w.Var(n.Var)
		w.stmt(n.Body)
	case *Evaluate:
		w.Tag("evaluate")
		w.Node(n.Value)
	case *AttrStmt:
		w.Tag("attr")
		w.Node(n.Node)
		w.Tag(n.Key)
		w.Node(n.Value)
		w.stmt(n.Body)
	case *AssertStmt:
		w.Tag("assert")
		w.Node(n.Cond)
		w.Tag(n.Message)
	case Range:
		w.Tag("range")
		w.rng(n)
	case IterVar:
		w.Tag("itervar")
		w.Var(n.Var)
		w.rng(n.Dom)
		w.Int(int64(n.Kind))
	case BufferRegion:
		w.Tag("region")
		w.regions([]BufferRegion{n})
	case *Buffer:
		w.Buffer(n)
	case *PrimFunc:
		w.Tag("primfunc")
		w.Int(int64(len(n.Params)))
		for _, p := range n.Params {
			w.Var(p)
			if b, ok := n.BufferMap[p]; ok {
				w.Buffer(b)
			} else {
				w.Tag("scalar")
			}
		}
		w.DType(n.RetType)
		w.Attrs(n.Attrs)
		w.stmt(n.Body)
	case *GlobalVar:
		w.Tag("gvar")
		w.Tag(n.Name)
	case *IRModule:
		w.Tag("module")
		names := slices.Sorted(slices.Values(n.names))
		w.Int(int64(len(names)))
		for _, name := range names {
			w.Tag(name)
			w.Node(n.funcs[name])
		}
		w.Attrs(n.Attrs)
	case Structural:
		w.Tag(fmt.Sprintf("%T", n))
		n.WriteStructure(w)
	default:
		panic(fmt.Sprintf("ir: structural equality of unsupported node %T", n))
	}
}
