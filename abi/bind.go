package abi

import (
	"fmt"
	"maps"
	"slices"
	"strings"
)

// Bind checks the shapes of the tensor arguments a caller has (by parameter
// name) against the function's signature, and works out the shape of every
// other tensor parameter: static dimensions as declared, symbolic ones from
// the given tensors (or from the given scalar integer parameters of the same
// name). It returns the shape of every tensor parameter, given or not.
//
// Errors name the parameter and what was wrong: an unknown name, a rank or a
// static extent that does not match, two tensors that disagree on a symbol,
// or a symbol that no argument determines.
func (f FuncInfo) Bind(tensors map[string][]int64, ints map[string]int64) (map[string][]int64, error) {
	byName := map[string]ParamInfo{}
	var names []string
	for _, p := range f.Params {
		byName[p.Name] = p
		names = append(names, p.Name)
	}
	for _, n := range slices.Sorted(maps.Keys(tensors)) {
		p, ok := byName[n]
		if !ok {
			return nil, fmt.Errorf("%s: no parameter %q (parameters: %s)", f.Name, n, strings.Join(names, ", "))
		}
		if p.Kind != ParamTensor {
			return nil, fmt.Errorf("%s: parameter %q is a %s, not a tensor", f.Name, n, p.Kind)
		}
	}
	syms := map[string]int64{}
	from := map[string]string{}
	for n, v := range ints {
		p, ok := byName[n]
		if !ok {
			return nil, fmt.Errorf("%s: no parameter %q (parameters: %s)", f.Name, n, strings.Join(names, ", "))
		}
		if p.Kind != ParamInt {
			return nil, fmt.Errorf("%s: parameter %q is a %s, not an int", f.Name, n, p.Kind)
		}
		syms[n], from[n] = v, "argument "+n
	}
	// Given tensors first, in parameter order, so errors are deterministic.
	for _, p := range f.Params {
		shape, ok := tensors[p.Name]
		if !ok || p.Shape == nil {
			continue
		}
		if len(shape) != len(p.Shape) {
			return nil, fmt.Errorf("%s: parameter %q: %d dimensions %s, want %d %s", f.Name, p.Name, len(shape), fmtShape(shape), len(p.Shape), fmtDims(p.Shape))
		}
		for i, d := range p.Shape {
			if d.Name == "" {
				if shape[i] != d.Value {
					return nil, fmt.Errorf("%s: parameter %q: shape %s, want %s", f.Name, p.Name, fmtShape(shape), fmtDims(p.Shape))
				}
				continue
			}
			if v, ok := syms[d.Name]; ok && v != shape[i] {
				return nil, fmt.Errorf("%s: parameter %q: dimension %d is %d, but %s is %d from %s", f.Name, p.Name, i, shape[i], d.Name, v, from[d.Name])
			}
			syms[d.Name], from[d.Name] = shape[i], "parameter "+p.Name
		}
	}
	out := map[string][]int64{}
	for _, p := range f.Params {
		if p.Kind != ParamTensor {
			continue
		}
		if shape, ok := tensors[p.Name]; ok {
			out[p.Name] = slices.Clone(shape)
			continue
		}
		if p.Shape == nil {
			return nil, fmt.Errorf("%s: parameter %q has no declared shape; give it as an input", f.Name, p.Name)
		}
		shape := make([]int64, len(p.Shape))
		for i, d := range p.Shape {
			if d.Name == "" {
				shape[i] = d.Value
				continue
			}
			v, ok := syms[d.Name]
			if !ok {
				return nil, fmt.Errorf("%s: parameter %q: dimension %d is %s, which no input determines; give an input that has it", f.Name, p.Name, i, d.Name)
			}
			shape[i] = v
		}
		out[p.Name] = shape
	}
	return out, nil
}

func fmtShape(s []int64) string {
	parts := make([]string, len(s))
	for i, d := range s {
		parts[i] = fmt.Sprint(d)
	}
	return tuple(parts)
}

func fmtDims(ds []Dim) string {
	parts := make([]string, len(ds))
	for i, d := range ds {
		if d.Name != "" {
			parts[i] = d.Name
		} else {
			parts[i] = fmt.Sprint(d.Value)
		}
	}
	return tuple(parts)
}

func tuple(parts []string) string {
	if len(parts) == 1 {
		return "(" + parts[0] + ",)"
	}
	return "(" + strings.Join(parts, ", ") + ")"
}
