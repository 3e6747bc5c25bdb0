package ir

import "fmt"

// Buffer is a multi-dimensional view of memory. Its identity is its pointer:
// two buffers with equal fields are still two buffers. Shape and Strides
// may hold symbolic expressions (variables defined by the PrimFunc's
// parameters or buffer map).
type Buffer struct {
	// Name is a hint for printing.
	Name string
	// DType is the element type.
	DType DType
	// Shape has one extent per dimension.
	Shape []Expr
	// Strides, in elements, one per dimension; nil means compact row-major.
	Strides []Expr
	// ElemOffset is the offset of element 0 from Data, in elements; nil means 0.
	ElemOffset Expr
	// Scope is the storage scope: "global" (also ""), "local", "shared"…
	Scope string
	// Data is the variable holding the base pointer (dtype Handle).
	Data *Var
}

// NewBuffer returns a compact buffer with a fresh data variable named name.
// An empty scope means "global".
func NewBuffer(name string, t DType, shape []Expr, scope string) *Buffer {
	if scope == "" {
		scope = "global"
	}
	for i, s := range shape {
		if s == nil {
			panic(fmt.Sprintf("ir: buffer %q has a nil extent at dimension %d", name, i))
		}
	}
	return &Buffer{Name: name, DType: t, Shape: shape, Scope: scope, Data: NewVar(name, Handle)}
}

// StorageScope returns the buffer's scope, "global" when empty.
func (b *Buffer) StorageScope() string {
	if b.Scope == "" {
		return "global"
	}
	return b.Scope
}

// NDim is the number of dimensions.
func (b *Buffer) NDim() int { return len(b.Shape) }

// Load returns b[indices…].
func (b *Buffer) Load(indices ...Expr) *BufferLoad { return NewBufferLoad(b, indices...) }

// Store returns the statement b[indices…] = value.
func (b *Buffer) Store(value Expr, indices ...Expr) *BufferStore {
	return NewBufferStore(b, value, indices...)
}

// FullRegion returns the region covering the whole buffer.
func (b *Buffer) FullRegion() BufferRegion {
	r := make([]Range, len(b.Shape))
	for i, s := range b.Shape {
		r[i] = Range{Min: NewIntImm(s.DType(), 0), Extent: s}
	}
	return BufferRegion{Buffer: b, Region: r}
}

// String is the buffer's name.
func (b *Buffer) String() string { return b.Name }

// Range is the half-open interval [Min, Min+Extent).
type Range struct {
	Min, Extent Expr
}

// RangeFromExtent returns [0, extent).
func RangeFromExtent(extent Expr) Range {
	return Range{Min: NewIntImm(extent.DType(), 0), Extent: extent}
}

// BufferRegion is a rectangular part of a buffer: one Range per dimension.
type BufferRegion struct {
	Buffer *Buffer
	Region []Range
}

// PointRegion returns the one-element region of b at indices.
func PointRegion(b *Buffer, indices ...Expr) BufferRegion {
	r := make([]Range, len(indices))
	for i, ix := range indices {
		r[i] = Range{Min: ix, Extent: NewIntImm(ix.DType(), 1)}
	}
	return BufferRegion{Buffer: b, Region: r}
}

// IterKind says how a block iteration variable is used.
type IterKind uint8

// Iteration kinds.
const (
	// IterSpatial (data parallel): each value writes its own outputs.
	IterSpatial IterKind = iota
	// IterReduce: values accumulate into the same outputs.
	IterReduce
	// IterOpaque: neither; schedules treat it conservatively.
	IterOpaque
)

// String is "spatial", "reduce" or "opaque".
func (k IterKind) String() string {
	switch k {
	case IterSpatial:
		return "spatial"
	case IterReduce:
		return "reduce"
	case IterOpaque:
		return "opaque"
	}
	return fmt.Sprintf("IterKind(%d)", uint8(k))
}

// IterVar is an iteration variable of a Block: Var takes the values of Dom.
type IterVar struct {
	Var  *Var
	Dom  Range
	Kind IterKind
}
