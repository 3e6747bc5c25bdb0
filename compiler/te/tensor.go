package te

import (
	"fmt"

	"github.com/kiln-ml/kiln/compiler/ir"
)

// Tensor is the result of a stage: a Placeholder (an input) or a Compute
// stage. Its Buffer is the buffer the generated PrimFunc uses for it.
type Tensor struct {
	// Name names the tensor, its buffer and (for Compute) its block.
	Name string
	// Shape has one extent per dimension (constants or size variables).
	Shape []ir.Expr
	// DType is the element type.
	DType ir.DType

	buf *ir.Buffer
	op  *computeOp // nil for a placeholder
	err error
}

// computeOp is what Compute recorded about a stage.
type computeOp struct {
	axes   []*ir.Var  // one index variable per dimension
	value  ir.Expr    // the element value (nil for a reduction)
	red    *reduction // the reduction, or nil
	inputs []*Tensor  // tensors read, in first-use order
}

// reduction is a resolved Sum, Max or Min.
type reduction struct {
	kind   reduceKind
	source ir.Expr
	axes   []*Axis
}

// Var returns a symbolic size variable of dtype int32, like TVM's te.var.
// Shapes and loops built from int32 sizes use int32 indices.
func Var(name string) *ir.Var { return ir.NewVar(name, ir.Int32) }

// VarOf returns a symbolic size variable of integer dtype t (ir.Int64 for
// shapes beyond 2^31 elements).
func VarOf(name string, t ir.DType) *ir.Var { return ir.NewVar(name, t) }

// Shape returns constant extents as int32 expressions, for Placeholder
// and Compute: te.Shape(1024, 1024).
func Shape(dims ...int64) []ir.Expr {
	out := make([]ir.Expr, len(dims))
	for i, d := range dims {
		out[i] = ir.I32(d)
	}
	return out
}

// Placeholder returns an input tensor of the given shape and dtype.
func Placeholder(shape []ir.Expr, dtype ir.DType, name string) *Tensor {
	t := &Tensor{Name: name, Shape: append([]ir.Expr(nil), shape...), DType: dtype}
	t.err = checkShape(name, shape)
	if t.err == nil {
		t.buf = ir.NewBuffer(name, dtype, t.Shape, "global")
	}
	return t
}

// checkShape reports nil or non-integer extents.
func checkShape(name string, shape []ir.Expr) error {
	for d, e := range shape {
		if e == nil {
			return fmt.Errorf("tensor %q: extent %d is nil", name, d)
		}
		if _, bad := e.(*Axis); bad {
			return fmt.Errorf("tensor %q: extent %d is the reduce axis %q", name, d, e.(*Axis).Name)
		}
		if !ir.IsIndexType(e.DType()) {
			return fmt.Errorf("tensor %q: extent %d (%s) has dtype %s, want an integer", name, d, e, e.DType())
		}
	}
	return nil
}

// NDim is the number of dimensions.
func (t *Tensor) NDim() int { return len(t.Shape) }

// Buffer returns the buffer that stands for t in generated PrimFuncs (nil
// when t has an error).
func (t *Tensor) Buffer() *ir.Buffer { return t.buf }

// IsPlaceholder reports whether t is an input rather than a Compute stage.
func (t *Tensor) IsPlaceholder() bool { return t.op == nil }

// Err returns the first mistake found in t's definition or in the
// definitions of the tensors it reads, or nil.
func (t *Tensor) Err() error { return t.err }

// At returns the element of t at indices, for use inside a Compute
// closure (TVM's A[i, j]). A wrong number of indices is reported by the
// Compute that uses the element.
func (t *Tensor) At(indices ...ir.Expr) ir.Expr {
	load := &ir.BufferLoad{Buffer: t.buf, Indices: indices}
	if t.buf == nil {
		// A tensor with an error still yields an expression with its
		// dtype; Compute reports the error.
		load.Buffer = &ir.Buffer{Name: t.Name, DType: t.DType}
	}
	return &element{BufferLoad: load, t: t}
}

// String is the tensor's name.
func (t *Tensor) String() string { return t.Name }

// element is t[indices] inside a Compute closure. It is an ir.Expr by
// embedding; Compute replaces it with a BufferLoad of t's buffer.
type element struct {
	*ir.BufferLoad
	t *Tensor
}

// Axis is a reduce axis (TVM's te.reduce_axis): a variable ranging over
// Dom, used in the source of a Sum, Max or Min over it. It is an ir.Expr,
// so it indexes tensors directly: A.At(i, k).
type Axis struct {
	*ir.Var
	// Dom is the range the axis covers.
	Dom ir.Range
}

// ReduceAxis returns a reduce axis over dom; its dtype is dom's extent's.
// ReduceAxis(ir.RangeFromExtent(K), "k") is TVM's te.reduce_axis((0, K), "k").
func ReduceAxis(dom ir.Range, name string) *Axis {
	t := ir.Int32
	if dom.Extent != nil {
		t = dom.Extent.DType()
	}
	if dom.Min == nil && dom.Extent != nil {
		dom.Min = ir.NewIntImm(t, 0)
	}
	return &Axis{Var: ir.NewVar(name, t), Dom: dom}
}
