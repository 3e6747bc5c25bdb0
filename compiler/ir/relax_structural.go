package ir

// Structural equality of graph-level nodes: graph variables are numbered
// by first occurrence like TensorIR variables, with their struct info and
// dataflow flag written at the defining occurrence; names do not count.

// RVar writes a graph variable: its number, and at its first occurrence
// its struct info and whether it is a dataflow variable.
func (w *StructuralWriter) RVar(v *RVar) {
	if v == nil {
		w.Tag("nil")
		return
	}
	if w.id != nil {
		i, ok := w.id.rvars[v]
		if !ok {
			i = len(w.id.rvars)
			w.id.rvars[v] = i
		}
		w.Tag("rv")
		w.Int(int64(i))
		return
	}
	if i, ok := w.rvars[v]; ok {
		w.Tag("rv")
		w.Int(int64(i))
		return
	}
	if w.rvars == nil {
		w.rvars = map[*RVar]int{}
	}
	i := len(w.rvars)
	w.rvars[v] = i
	w.Tag("rvdef")
	w.Int(int64(i))
	if v.Dataflow {
		w.Int(1)
	} else {
		w.Int(0)
	}
	w.Node(v.Info)
}

func (w *StructuralWriter) rexprs(es []RExpr) {
	w.Int(int64(len(es)))
	for _, e := range es {
		w.Node(e)
	}
}

// WriteStructure writes the variable (see StructuralWriter.RVar).
func (v *RVar) WriteStructure(w *StructuralWriter) { w.RVar(v) }

// WriteStructure writes the operator's name.
func (o *Op) WriteStructure(w *StructuralWriter) { w.Tag(o.Name) }

// WriteStructure writes the function's name.
func (f *ExternFunc) WriteStructure(w *StructuralWriter) { w.Tag(f.Name) }

// WriteStructure writes the call.
func (c *RCall) WriteStructure(w *StructuralWriter) {
	w.Node(c.Op)
	w.rexprs(c.Args)
	w.Attrs(c.Attrs)
	w.Int(int64(len(c.SInfoArgs)))
	for _, s := range c.SInfoArgs {
		w.Node(s)
	}
}

// WriteStructure writes the tuple.
func (t *RTuple) WriteStructure(w *StructuralWriter) { w.rexprs(t.Fields) }

// WriteStructure writes the tuple and index.
func (t *TupleGetItem) WriteStructure(w *StructuralWriter) {
	w.Node(t.Tuple)
	w.Int(int64(t.Index))
}

// WriteStructure writes dtype, shape and data.
func (c *Constant) WriteStructure(w *StructuralWriter) {
	w.DType(c.DType)
	w.Int(int64(len(c.Shape)))
	for _, d := range c.Shape {
		w.Int(d)
	}
	w.Tag(string(c.Data))
}

// WriteStructure writes the values.
func (s *ShapeExpr) WriteStructure(w *StructuralWriter) { w.exprs(s.Values) }

// WriteStructure writes the value.
func (p *PrimValue) WriteStructure(w *StructuralWriter) { w.Node(p.Value) }

// WriteStructure writes the string.
func (s *RString) WriteStructure(w *StructuralWriter) { w.Tag(s.Value) }

// WriteStructure writes the dtype.
func (d *DataTypeImm) WriteStructure(w *StructuralWriter) { w.DType(d.DType) }

// WriteStructure writes the condition and branches.
func (e *RIf) WriteStructure(w *StructuralWriter) {
	w.Node(e.Cond)
	w.Node(e.Then)
	w.Node(e.Else)
}

// WriteStructure writes the blocks and body.
func (s *SeqExpr) WriteStructure(w *StructuralWriter) {
	w.Int(int64(len(s.Blocks)))
	for _, b := range s.Blocks {
		w.Node(b)
	}
	w.Node(s.Body)
}

// WriteStructure writes the bindings.
func (b *BindingBlock) WriteStructure(w *StructuralWriter) {
	if b.Dataflow {
		w.Int(1)
	} else {
		w.Int(0)
	}
	w.Int(int64(len(b.Bindings)))
	for _, x := range b.Bindings {
		w.Node(x)
	}
}

// WriteStructure writes the value, then the variable it defines.
func (b *VarBinding) WriteStructure(w *StructuralWriter) {
	w.Node(b.Value)
	w.RVar(b.Var)
}

// WriteStructure writes the value, the struct info, then the variable.
func (b *MatchCast) WriteStructure(w *StructuralWriter) {
	w.Node(b.Value)
	w.Node(b.Info)
	w.RVar(b.Var)
}

// WriteStructure writes parameters, attributes, purity, result and body.
func (f *Function) WriteStructure(w *StructuralWriter) {
	w.Int(int64(len(f.Params)))
	for _, p := range f.Params {
		w.RVar(p)
	}
	w.Attrs(f.Attrs)
	if f.Pure {
		w.Int(1)
	} else {
		w.Int(0)
	}
	w.Node(f.Ret)
	w.Node(f.Body)
}
