package transform

import "github.com/kiln-ml/kiln/compiler/ir"

// AttrOutputs ([]string) names the tensor parameters a function writes,
// when they cannot be read from its body: a host function whose stores
// were moved into device kernels carries the names found before the
// split. MakePackedAPI marks those parameters as outputs in the signature.
const AttrOutputs = "kiln.outputs"

// WrittenParams names, in parameter order, the buffer parameters f may
// write: stored to, listed in a block's writes, or whose data pointer is
// handed to a call (an opaque callee may write through it). The others are
// only read.
func WrittenParams(f *ir.PrimFunc) []string {
	if names, ok := f.Attrs[AttrOutputs].([]string); ok {
		return names
	}
	byData := map[*ir.Var]*ir.Buffer{}
	for _, p := range f.Params {
		if b := f.BufferMap[p]; b != nil && b.Data != nil {
			byData[b.Data] = b
		}
	}
	written := map[*ir.Buffer]bool{}
	mark := func(b *ir.Buffer) {
		if b == nil {
			return
		}
		if pb, ok := byData[b.Data]; ok {
			written[pb] = true
		}
	}
	ir.Visit(f.Body, func(n ir.Node) bool {
		switch n := n.(type) {
		case *ir.BufferStore:
			mark(n.Buffer)
		case *ir.Block:
			for _, w := range n.Writes {
				mark(w.Buffer)
			}
		case *ir.Call:
			for _, a := range n.Args {
				if v, ok := a.(*ir.Var); ok {
					if pb, ok := byData[v]; ok {
						written[pb] = true
					}
				}
			}
		}
		return true
	})
	var out []string
	for _, p := range f.Params {
		if b := f.BufferMap[p]; b != nil && written[b] {
			out = append(out, b.Name)
		}
	}
	return out
}
