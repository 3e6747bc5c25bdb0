package tune

import (
	"fmt"
	"maps"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/transform"
)

// A workload with symbolic sizes (a matmul whose N, M, K are variables
// of its match_buffer shapes) has no loop extents the rules can tile, so
// it is tuned bound to a shape: Bind replaces the named size variables
// with constants, the bound function is a workload of its own (its hash
// differs for every shape), and its records also name the unbound
// function (Workload.Generic) and the shape (Workload.Shape). Apply gives
// the symbolic function the schedule of such a record by specializing it
// to the record's shape, as TVM's PrimFunc.specialize does: the built
// kernel then takes those sizes only.

// SizeVars returns the symbolic size variables of f by name: the
// variables of its buffers' shapes, strides and offsets, and its scalar
// parameters.
func SizeVars(f *ir.PrimFunc) map[string]*ir.Var {
	out := map[string]*ir.Var{}
	add := func(e ir.Expr) {
		ir.Visit(e, func(x ir.Node) bool {
			if v, ok := x.(*ir.Var); ok {
				out[v.Name] = v
			}
			return true
		})
	}
	for _, p := range f.Params {
		b, ok := f.BufferMap[p]
		if !ok {
			if p.Type.IsInt() {
				out[p.Name] = p
			}
			continue
		}
		for _, e := range b.Shape {
			add(e)
		}
		for _, e := range b.Strides {
			add(e)
		}
		if b.ElemOffset != nil {
			add(b.ElemOffset)
		}
	}
	return out
}

// Bind returns f with the size variables named in shape replaced by
// those sizes (scalar parameters bound this way are dropped), simplified
// so that loops over them get constant extents. A name f has no size
// variable of, or a size below 1, is an error naming it.
func Bind(f *ir.PrimFunc, shape map[string]int64) (*ir.PrimFunc, error) {
	vars := SizeVars(f)
	vmap := map[*ir.Var]ir.Expr{}
	for _, name := range slices.Sorted(maps.Keys(shape)) {
		v, ok := vars[name]
		if !ok {
			return nil, fmt.Errorf("--shape %s: the function has no symbolic size %q (%s)", name, name, describeSizes(vars))
		}
		if shape[name] < 1 {
			return nil, fmt.Errorf("--shape %s=%d: a size must be at least 1", name, shape[name])
		}
		vmap[v] = ir.NewIntImm(v.Type, shape[name])
	}
	g := ir.SubstituteFunc(f, vmap)
	if len(g.Params) > 0 {
		h := *g
		h.Params = nil
		for _, p := range g.Params {
			if _, bound := vmap[p]; !bound {
				h.Params = append(h.Params, p)
			}
		}
		g = &h
	}
	return transform.Simplify(g)
}

func describeSizes(vars map[string]*ir.Var) string {
	if len(vars) == 0 {
		return "its sizes are all constant"
	}
	return "its symbolic sizes: " + strings.Join(slices.Sorted(maps.Keys(vars)), ", ")
}

// ParseShape parses NAME=SIZE bindings ("n=1024", or several separated
// by commas), as kiln tune --shape takes them.
func ParseShape(specs []string) (map[string]int64, error) {
	out := map[string]int64{}
	for _, spec := range specs {
		for _, kv := range strings.Split(spec, ",") {
			kv = strings.TrimSpace(kv)
			if kv == "" {
				continue
			}
			name, val, ok := strings.Cut(kv, "=")
			name = strings.TrimSpace(name)
			if !ok || name == "" {
				return nil, fmt.Errorf("--shape %q: want NAME=SIZE, e.g. n=1024", kv)
			}
			n, err := strconv.ParseInt(strings.TrimSpace(val), 10, 64)
			if err != nil || n < 1 {
				return nil, fmt.Errorf("--shape %q: the size of %s must be a whole number of at least 1", kv, name)
			}
			if old, dup := out[name]; dup && old != n {
				return nil, fmt.Errorf("--shape: %s given twice (%d and %d)", name, old, n)
			}
			out[name] = n
		}
	}
	return out, nil
}

// FormatShape writes a binding as "K=1024,M=1024,N=1024" (sorted).
func FormatShape(shape map[string]int64) string {
	keys := make([]string, 0, len(shape))
	for k := range shape {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s=%d", k, shape[k])
	}
	return strings.Join(parts, ",")
}

// bindFor returns the part of shape that names size variables of f.
func bindFor(f *ir.PrimFunc, shape map[string]int64) map[string]int64 {
	vars := SizeVars(f)
	out := map[string]int64{}
	for k, v := range shape {
		if _, ok := vars[k]; ok {
			out[k] = v
		}
	}
	return out
}
