package main

/*
#include <stdlib.h>
#include "support.h"
*/
import "C"

import (
	"encoding/json"
	"fmt"
	"strings"
	"sync"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/schedule"
	"github.com/kiln-ml/kiln/compiler/script"
)

// schedObj is a tir.Schedule of one PrimFunc. The binding names blocks
// and loops by small integers that index blocks and loops here: the
// handles a primitive returned, in the order they were made.
type schedObj struct {
	mu     sync.Mutex
	s      *schedule.Schedule
	blocks []schedule.BlockRV
	loops  []schedule.LoopRV
}

func (*schedObj) kind() string { return "schedule" }
func (*schedObj) free()        {}

// primFuncOf returns the PrimFunc called name in the TVMScript text src,
// or its only PrimFunc when name is empty.
func primFuncOf(src, name string) (*ir.PrimFunc, error) {
	m, err := script.Parse("module.py", src)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, n := range m.Names() {
		if m.PrimFunc(n) != nil {
			names = append(names, n)
		}
	}
	if name == "" {
		if len(names) != 1 {
			return nil, fmt.Errorf("the module has %d PrimFuncs (%s); name one", len(names), strings.Join(names, ", "))
		}
		name = names[0]
	}
	f := m.PrimFunc(name)
	if f == nil {
		return nil, fmt.Errorf("the module has no PrimFunc %q (it has %s)", name, strings.Join(names, ", "))
	}
	return f, nil
}

// moduleText prints f as a module of one function named after its global
// symbol.
func moduleText(f *ir.PrimFunc) string {
	name, _ := f.Attrs[ir.AttrGlobalSymbol].(string)
	if name == "" {
		name = "main"
	}
	return script.Print(ir.NewIRModule().With(name, f))
}

//export kiln_tir_function
func kiln_tir_function(src, name, rename *C.char, out **C.char) C.int {
	if out == nil {
		return fail(badArg("no place for the module's text (NULL)"), errArgument)
	}
	f, err := primFuncOf(gostr(src), gostr(name))
	if err != nil {
		return fail(badArg("%v", err), errArgument)
	}
	if r := gostr(rename); r != "" {
		f = f.WithAttr(ir.AttrGlobalSymbol, r)
	}
	return outString(out, moduleText(f))
}

//export kiln_schedule_new
func kiln_schedule_new(src, name *C.char, out *C.KilnHandle) C.int {
	if out == nil {
		return fail(badArg("no place for the schedule (NULL)"), errArgument)
	}
	f, err := primFuncOf(gostr(src), gostr(name))
	if err != nil {
		return fail(badArg("tir.Schedule: %v", err), errArgument)
	}
	s, err := schedule.New(f)
	if err != nil {
		return fail(badArg("tir.Schedule: %v", err), errArgument)
	}
	*out = newHandle(&schedObj{s: s})
	return 0
}

//export kiln_schedule_copy
func kiln_schedule_copy(h C.KilnHandle, out *C.KilnHandle) C.int {
	o, err := lookup[*schedObj](h, "schedule")
	if err != nil {
		return fail(err, errArgument)
	}
	if out == nil {
		return fail(badArg("no place for the schedule (NULL)"), errArgument)
	}
	o.mu.Lock()
	c := &schedObj{s: o.s.Copy(), blocks: append([]schedule.BlockRV(nil), o.blocks...), loops: append([]schedule.LoopRV(nil), o.loops...)}
	o.mu.Unlock()
	*out = newHandle(c)
	return 0
}

//export kiln_schedule_script
func kiln_schedule_script(h C.KilnHandle, out **C.char) C.int {
	o, err := lookup[*schedObj](h, "schedule")
	if err != nil {
		return fail(err, errArgument)
	}
	o.mu.Lock()
	f := o.s.Func()
	o.mu.Unlock()
	return outString(out, moduleText(f))
}

//export kiln_schedule_trace
func kiln_schedule_trace(h C.KilnHandle, out **C.char) C.int {
	o, err := lookup[*schedObj](h, "schedule")
	if err != nil {
		return fail(err, errArgument)
	}
	o.mu.Lock()
	tr := o.s.Trace()
	o.mu.Unlock()
	b, _ := json.Marshal(tr)
	return outString(out, string(b))
}

//export kiln_schedule_apply
func kiln_schedule_apply(h C.KilnHandle, prim, args *C.char, out **C.char) C.int {
	o, err := lookup[*schedObj](h, "schedule")
	if err != nil {
		return fail(err, errArgument)
	}
	if out == nil {
		return fail(badArg("no place for the result (NULL)"), errArgument)
	}
	o.mu.Lock()
	res, err := o.apply(gostr(prim), []byte(gostr(args)))
	o.mu.Unlock()
	if err != nil {
		return fail(badArg("%v", err), errArgument)
	}
	b, err := json.Marshal(res)
	if err != nil {
		return fail(err, errInternal)
	}
	return outString(out, string(b))
}

// rvRef is a block or loop as the binding sees it: its number and the name
// it had when it was made.
type rvRef struct {
	Block *int   `json:"block,omitempty"`
	Loop  *int   `json:"loop,omitempty"`
	Name  string `json:"name"`
}

func (o *schedObj) blockRef(b schedule.BlockRV) rvRef {
	o.blocks = append(o.blocks, b)
	n := len(o.blocks) - 1
	return rvRef{Block: &n, Name: b.String()}
}

func (o *schedObj) loopRef(l schedule.LoopRV) rvRef {
	o.loops = append(o.loops, l)
	n := len(o.loops) - 1
	return rvRef{Loop: &n, Name: l.String()}
}

func (o *schedObj) loopRefs(ls []schedule.LoopRV) []rvRef {
	out := make([]rvRef, len(ls))
	for i, l := range ls {
		out[i] = o.loopRef(l)
	}
	return out
}

// schedArgs decodes the arguments of one primitive call.
type schedArgs struct {
	o    *schedObj
	prim string
	raw  []json.RawMessage
}

func (a *schedArgs) count(lo, hi int) error {
	if len(a.raw) < lo || len(a.raw) > hi {
		if lo == hi {
			return fmt.Errorf("%s takes %d arguments, got %d", a.prim, lo, len(a.raw))
		}
		return fmt.Errorf("%s takes %d to %d arguments, got %d", a.prim, lo, hi, len(a.raw))
	}
	return nil
}

func (a *schedArgs) ref(i int) (rvRef, error) {
	var r rvRef
	if i >= len(a.raw) {
		return r, fmt.Errorf("%s: argument %d is missing", a.prim, i)
	}
	if err := json.Unmarshal(a.raw[i], &r); err != nil || (r.Block == nil) == (r.Loop == nil) {
		return r, fmt.Errorf("%s: argument %d (%.40s) is not a block or a loop of this schedule", a.prim, i, a.raw[i])
	}
	return r, nil
}

func (a *schedArgs) block(i int) (schedule.BlockRV, error) {
	r, err := a.ref(i)
	if err != nil {
		return schedule.BlockRV{}, err
	}
	if r.Block == nil {
		return schedule.BlockRV{}, fmt.Errorf("%s: argument %d is the loop %q, want a block", a.prim, i, r.Name)
	}
	if *r.Block < 0 || *r.Block >= len(a.o.blocks) {
		return schedule.BlockRV{}, fmt.Errorf("%s: argument %d is not a block of this schedule", a.prim, i)
	}
	return a.o.blocks[*r.Block], nil
}

func (a *schedArgs) loop(i int) (schedule.LoopRV, error) {
	r, err := a.ref(i)
	if err != nil {
		return schedule.LoopRV{}, err
	}
	if r.Loop == nil {
		return schedule.LoopRV{}, fmt.Errorf("%s: argument %d is the block %q, want a loop", a.prim, i, r.Name)
	}
	if *r.Loop < 0 || *r.Loop >= len(a.o.loops) {
		return schedule.LoopRV{}, fmt.Errorf("%s: argument %d is not a loop of this schedule", a.prim, i)
	}
	return a.o.loops[*r.Loop], nil
}

func (a *schedArgs) loopsFrom(i int) ([]schedule.LoopRV, error) {
	var out []schedule.LoopRV
	for j := i; j < len(a.raw); j++ {
		l, err := a.loop(j)
		if err != nil {
			return nil, err
		}
		out = append(out, l)
	}
	return out, nil
}

func (a *schedArgs) str(i int) (string, error) {
	var s string
	if err := json.Unmarshal(a.raw[i], &s); err != nil {
		return "", fmt.Errorf("%s: argument %d (%.40s) is not a string", a.prim, i, a.raw[i])
	}
	return s, nil
}

func (a *schedArgs) int(i int) (int64, error) {
	var n int64
	if err := json.Unmarshal(a.raw[i], &n); err != nil {
		return 0, fmt.Errorf("%s: argument %d (%.40s) is not an integer", a.prim, i, a.raw[i])
	}
	return n, nil
}

// factors decodes split's factor list: integers, null for the one to infer.
func (a *schedArgs) factors(i int) ([]int64, error) {
	var fs []*int64
	if err := json.Unmarshal(a.raw[i], &fs); err != nil {
		return nil, fmt.Errorf("%s: factors %.60s: want a list of integers and at most one None", a.prim, a.raw[i])
	}
	out := make([]int64, len(fs))
	for j, f := range fs {
		switch {
		case f == nil:
			out[j] = -1
		case *f == -1:
			return nil, fmt.Errorf("%s: factor %d is -1; write None for the factor to infer", a.prim, j)
		default:
			out[j] = *f
		}
	}
	return out, nil
}

// apply runs primitive prim with the JSON argument list args and returns
// its result: null, a block or loop reference, or a list of them.
func (o *schedObj) apply(prim string, args []byte) (any, error) {
	a := &schedArgs{o: o, prim: prim}
	if err := json.Unmarshal(args, &a.raw); err != nil {
		return nil, fmt.Errorf("%s: arguments %.60s are not a JSON list", prim, args)
	}
	s := o.s
	switch prim {
	case "get_block":
		if err := a.count(1, 1); err != nil {
			return nil, err
		}
		name, err := a.str(0)
		if err != nil {
			return nil, err
		}
		b, err := s.GetBlock(name)
		if err != nil {
			return nil, err
		}
		return o.blockRef(b), nil
	case "get_loops":
		if err := a.count(1, 1); err != nil {
			return nil, err
		}
		b, err := a.block(0)
		if err != nil {
			return nil, err
		}
		ls, err := s.GetLoops(b)
		if err != nil {
			return nil, err
		}
		return o.loopRefs(ls), nil
	case "get_child_blocks":
		if err := a.count(1, 1); err != nil {
			return nil, err
		}
		l, err := a.loop(0)
		if err != nil {
			return nil, err
		}
		bs, err := s.GetChildBlocks(l)
		if err != nil {
			return nil, err
		}
		out := make([]rvRef, len(bs))
		for i, b := range bs {
			out[i] = o.blockRef(b)
		}
		return out, nil
	case "split":
		if err := a.count(2, 2); err != nil {
			return nil, err
		}
		l, err := a.loop(0)
		if err != nil {
			return nil, err
		}
		fs, err := a.factors(1)
		if err != nil {
			return nil, err
		}
		ls, err := s.Split(l, fs...)
		if err != nil {
			return nil, err
		}
		return o.loopRefs(ls), nil
	case "fuse", "reorder":
		ls, err := a.loopsFrom(0)
		if err != nil {
			return nil, err
		}
		if prim == "reorder" {
			return nil, s.Reorder(ls...)
		}
		l, err := s.Fuse(ls...)
		if err != nil {
			return nil, err
		}
		return o.loopRef(l), nil
	case "parallel", "vectorize", "unroll":
		if err := a.count(1, 1); err != nil {
			return nil, err
		}
		l, err := a.loop(0)
		if err != nil {
			return nil, err
		}
		switch prim {
		case "parallel":
			return nil, s.Parallel(l)
		case "vectorize":
			return nil, s.Vectorize(l)
		}
		return nil, s.Unroll(l)
	case "bind":
		if err := a.count(2, 2); err != nil {
			return nil, err
		}
		l, err := a.loop(0)
		if err != nil {
			return nil, err
		}
		tag, err := a.str(1)
		if err != nil {
			return nil, err
		}
		return nil, s.Bind(l, tag)
	case "annotate":
		if err := a.count(3, 3); err != nil {
			return nil, err
		}
		l, err := a.loop(0)
		if err != nil {
			return nil, err
		}
		key, err := a.str(1)
		if err != nil {
			return nil, err
		}
		var v any
		if err := json.Unmarshal(a.raw[2], &v); err != nil {
			return nil, fmt.Errorf("annotate: bad value %.40s", a.raw[2])
		}
		if f, ok := v.(float64); ok && !strings.ContainsAny(string(a.raw[2]), ".eE") {
			v = int64(f)
		}
		return nil, s.Annotate(l, key, v)
	case "cache_read", "cache_write":
		if err := a.count(3, 3); err != nil {
			return nil, err
		}
		b, err := a.block(0)
		if err != nil {
			return nil, err
		}
		i, err := a.int(1)
		if err != nil {
			return nil, err
		}
		scope, err := a.str(2)
		if err != nil {
			return nil, err
		}
		var nb schedule.BlockRV
		if prim == "cache_read" {
			nb, err = s.CacheRead(b, int(i), scope)
		} else {
			nb, err = s.CacheWrite(b, int(i), scope)
		}
		if err != nil {
			return nil, err
		}
		return o.blockRef(nb), nil
	case "compute_at", "reverse_compute_at", "decompose_reduction":
		if err := a.count(2, 2); err != nil {
			return nil, err
		}
		b, err := a.block(0)
		if err != nil {
			return nil, err
		}
		l, err := a.loop(1)
		if err != nil {
			return nil, err
		}
		switch prim {
		case "compute_at":
			return nil, s.ComputeAt(b, l)
		case "reverse_compute_at":
			return nil, s.ReverseComputeAt(b, l)
		}
		nb, err := s.DecomposeReduction(b, l)
		if err != nil {
			return nil, err
		}
		return o.blockRef(nb), nil
	case "compute_inline":
		if err := a.count(1, 1); err != nil {
			return nil, err
		}
		b, err := a.block(0)
		if err != nil {
			return nil, err
		}
		return nil, s.ComputeInline(b)
	}
	return nil, fmt.Errorf("tir.Schedule has no primitive %q (kiln has %s)", prim, strings.Join(schedPrimitives, ", "))
}

// schedPrimitives are the primitives apply knows.
var schedPrimitives = []string{
	"get_block", "get_loops", "get_child_blocks", "split", "fuse", "reorder", "parallel", "vectorize",
	"unroll", "bind", "annotate", "cache_read", "cache_write", "compute_at", "reverse_compute_at",
	"compute_inline", "decompose_reduction",
}
