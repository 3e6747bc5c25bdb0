package transform

import (
	"fmt"
	"maps"
	"sort"
	"strings"

	"github.com/kiln-ml/kiln/compiler/ir"
)

// KeepLastError is the message of an AssertStmt whose condition is a call
// that has already set the error message itself (a kernel launch): the code
// generators leave the message alone and only return the failure.
const KeepLastError = "\x00kiln: keep the callee's error"

// LaunchPrefix starts the name of the call_extern through which a host
// function launches a kernel: LaunchPrefix + the kernel's symbol. Its
// arguments are the grid's x, y, z extents, the block's x, y, z extents
// (int64), then the kernel's arguments in the order of its parameters. The
// code generator of the host defines one such function per kernel; it
// returns 0, or non-zero after setting the error.
const LaunchPrefix = "kiln_launch_"

// AttrDeviceKernel (bool) marks a PrimFunc that SplitHostDevice made from
// a thread-bound loop nest: a device kernel taking raw pointers.
const AttrDeviceKernel = "kiln.device_kernel"

// Launch is one kernel launch of a host function.
type Launch struct {
	// Kernel is the launched kernel's symbol.
	Kernel string
	// Grid and Block are the launch extents (x, y, z) as the host computes
	// them; an unbound axis has extent 1.
	Grid, Block [3]ir.Expr
}

// threadAxes maps a thread tag to its launch dimension: 0-2 the grid's x,
// y, z, 3-5 the block's.
var threadAxes = map[string]int{
	"blockIdx.x": 0, "blockIdx.y": 1, "blockIdx.z": 2,
	"threadIdx.x": 3, "threadIdx.y": 4, "threadIdx.z": 5,
}

// SplitHostDevice splits a lowered PrimFunc (after storage_rewrite,
// before make_packed_api) whose loops are bound to GPU thread axes into
// device kernels and a host function. Each outermost thread-bound loop
// nest becomes a kernel named after the function (sym_kernel, or
// sym_kernel0, sym_kernel1… when there are several) that takes the
// function's parameters and every variable the nest uses from the host
// (shape variables, host loop counters) as scalars. In the host function
// each nest is replaced by a launch (a call_extern of LaunchPrefix+kernel,
// see LaunchPrefix) whose grid and block extents are those of the nest's
// thread-bound loops; the host function keeps the rest (assertions,
// scalar lets, serial loops around launches) and gets AttrDeviceType
// deviceType, so make_packed_api checks its tensors are on that device.
//
// The host cannot touch device memory: a buffer access or allocation
// outside every thread-bound loop is an error naming the buffer, as is a
// thread axis bound with two different extents in one nest or a tag that
// is not a CUDA thread axis.
func SplitHostDevice(f *ir.PrimFunc, deviceType int64) (*ir.PrimFunc, []*ir.PrimFunc, []Launch, error) {
	name := FuncName(f)
	f = serialVirtualThreads(f)
	s := &splitter{f: f, name: name}
	var nests []*ir.For
	ir.Visit(f.Body, func(n ir.Node) bool {
		if fr, ok := n.(*ir.For); ok && fr.Kind == ir.ForThreadBinding {
			nests = append(nests, fr)
			return false
		}
		return true
	})
	if len(nests) == 0 {
		return nil, nil, nil, fmt.Errorf("split host/device: function %q has no thread-bound loop: give it a GPU schedule (bind loops to blockIdx/threadIdx)", name)
	}
	s.ids = map[*ir.For]int{}
	for i, n := range nests {
		s.ids[n] = i
	}
	s.multi = len(nests) > 1
	s.kernels = make([]*ir.PrimFunc, len(nests))
	s.launches = make([]Launch, len(nests))
	body := s.host(f.Body)
	if s.err != nil {
		return nil, nil, nil, s.err
	}
	attrs := maps.Clone(f.Attrs)
	if attrs == nil {
		attrs = map[string]any{}
	}
	attrs[AttrDeviceType] = deviceType
	host := &ir.PrimFunc{Params: f.Params, BufferMap: f.BufferMap, Body: body, RetType: f.RetType, Attrs: attrs}
	return host, s.kernels, s.launches, nil
}

type splitter struct {
	f        *ir.PrimFunc
	name     string
	ids      map[*ir.For]int
	multi    bool
	kernels  []*ir.PrimFunc
	launches []Launch
	err      error
	// allocs are the kernel-memory allocations around the statement being
	// split; usedBy maps each to the kernel that took it.
	allocs []*ir.Allocate
	usedBy map[*ir.Allocate]string
}

func (s *splitter) fail(format string, args ...any) {
	if s.err == nil {
		s.err = fmt.Errorf("split host/device: function %q: "+format, append([]any{s.name}, args...)...)
	}
}

// host rewrites a host statement: nests become launches; anything that
// touches a buffer is refused.
func (s *splitter) host(st ir.Stmt) ir.Stmt {
	if s.err != nil || st == nil {
		return st
	}
	switch n := st.(type) {
	case *ir.For:
		if n.Kind == ir.ForThreadBinding {
			return s.launch(n)
		}
		if n.Kind == ir.ForParallel {
			s.fail("loop %q is parallel outside every thread-bound loop; bind it to a thread axis", n.Var.Name)
			return st
		}
		s.noBuffers(n.Min, n.Extent)
		c := *n
		c.Kind = ir.ForSerial
		c.Body = s.host(n.Body)
		return &c
	case *ir.SeqStmt:
		out := make([]ir.Stmt, len(n.Seq))
		for i, x := range n.Seq {
			out[i] = s.host(x)
		}
		return &ir.SeqStmt{Seq: out}
	case *ir.LetStmt:
		s.noBuffers(n.Value)
		return &ir.LetStmt{Var: n.Var, Value: n.Value, Body: s.host(n.Body)}
	case *ir.IfThenElse:
		s.noBuffers(n.Cond)
		return &ir.IfThenElse{Cond: n.Cond, Then: s.host(n.Then), Else: s.host(n.Else)}
	case *ir.AssertStmt:
		s.noBuffers(n.Cond)
		return n
	case *ir.AttrStmt:
		return &ir.AttrStmt{Node: n.Node, Key: n.Key, Value: n.Value, Body: s.host(n.Body)}
	case *ir.Evaluate:
		s.noBuffers(n.Value)
		return n
	case *ir.Allocate:
		switch n.Buffer.StorageScope() {
		case "shared", "shared.dyn", "local":
			// Memory of the kernel: it moves into the kernel that uses it.
			s.allocs = append(s.allocs, n)
			body := s.host(n.Body)
			s.allocs = s.allocs[:len(s.allocs)-1]
			return body
		}
		s.fail("buffer %q (%s) is allocated outside every thread-bound loop; the host cannot allocate device memory inside a function (allocate it inside the kernel's loops, or split the function)", n.Buffer.Name, n.Buffer.StorageScope())
		return st
	case *ir.BufferStore:
		s.fail("store to %q outside every thread-bound loop: the host cannot write device memory (bind the loop around it to a thread axis)", n.Buffer.Name)
		return st
	}
	s.fail("statement %T outside every thread-bound loop", st)
	return st
}

// noBuffers refuses host expressions that read buffers.
func (s *splitter) noBuffers(es ...ir.Expr) {
	for _, e := range es {
		if e == nil {
			continue
		}
		ir.Visit(e, func(n ir.Node) bool {
			if l, ok := n.(*ir.BufferLoad); ok {
				s.fail("read of %q outside every thread-bound loop: the host cannot read device memory", l.Buffer.Name)
				return false
			}
			return true
		})
	}
}

// launch makes a kernel of nest and returns the statement that launches it.
func (s *splitter) launch(nest *ir.For) ir.Stmt {
	id := s.ids[nest]
	sym := s.name + "_kernel"
	if s.multi {
		sym = fmt.Sprintf("%s_kernel%d", s.name, id)
	}
	var ext [6]ir.Expr
	ir.Visit(nest, func(n ir.Node) bool {
		fr, ok := n.(*ir.For)
		if !ok || fr.Kind != ir.ForThreadBinding {
			return true
		}
		i, ok := threadAxes[fr.ThreadTag]
		if !ok {
			s.fail("loop %q is bound to %q, which is not a GPU thread axis (want blockIdx.x/y/z or threadIdx.x/y/z)", fr.Var.Name, fr.ThreadTag)
			return false
		}
		if m, ok := ir.IsConstInt(fr.Min); !ok || m != 0 {
			s.fail("loop %q bound to %s starts at %s, not 0", fr.Var.Name, fr.ThreadTag, fr.Min)
			return false
		}
		if ext[i] == nil {
			ext[i] = fr.Extent
		} else if !ir.StructuralEqual(ext[i], fr.Extent) {
			s.fail("kernel %q: %s is bound with extent %s and with extent %s (loop %q); every binding of an axis in a kernel needs the same extent", sym, fr.ThreadTag, ext[i], fr.Extent, fr.Var.Name)
			return false
		}
		return true
	})
	if s.err != nil {
		return nest
	}
	one := ir.NewIntImm(ir.Int64, 1)
	var l Launch
	l.Kernel = sym
	for i := range 6 {
		e := one
		if ext[i] != nil {
			e = ir.NewCast(ir.Int64, ext[i])
		}
		if i < 3 {
			l.Grid[i] = e
		} else {
			l.Block[i-3] = e
		}
	}

	// The kernel's parameters: the function's, then the host variables the
	// nest uses.
	params := append([]*ir.Var(nil), s.f.Params...)
	have := map[*ir.Var]bool{}
	for _, p := range s.f.Params {
		have[p] = true
		if b, ok := s.f.BufferMap[p]; ok {
			have[b.Data] = true
		}
	}
	var extra []*ir.Var
	for _, v := range freeVars(nest) {
		if !have[v] {
			extra = append(extra, v)
		}
	}
	sort.Slice(extra, func(i, j int) bool { return extra[i].Name < extra[j].Name })
	kernelBody := ir.Stmt(nest)
	// Shared and local buffers allocated around the nest move into it.
	free := map[*ir.Var]bool{}
	for _, v := range extra {
		free[v] = true
	}
	var keep []*ir.Var
	for i := len(s.allocs) - 1; i >= 0; i-- {
		a := s.allocs[i]
		if !free[a.Buffer.Data] {
			continue
		}
		if s.usedBy == nil {
			s.usedBy = map[*ir.Allocate]string{}
		}
		if other, ok := s.usedBy[a]; ok {
			s.fail("%s buffer %q is used by kernels %q and %q; %s memory does not outlive a kernel", a.Buffer.StorageScope(), a.Buffer.Name, other, sym, a.Buffer.StorageScope())
			return nest
		}
		s.usedBy[a] = sym
		kernelBody = &ir.Allocate{Buffer: a.Buffer, Body: kernelBody}
		delete(free, a.Buffer.Data)
	}
	for _, v := range extra {
		if !free[v] {
			continue
		}
		if v.Type == ir.Handle {
			s.fail("kernel %q uses the handle %q defined on the host; only the function's buffers and scalars reach a kernel", sym, v.Name)
			return nest
		}
		keep = append(keep, v)
	}
	extra = keep
	args := make([]ir.Expr, 0, 6+len(params)+len(extra))
	for _, e := range l.Grid {
		args = append(args, e)
	}
	for _, e := range l.Block {
		args = append(args, e)
	}
	bufMap := map[*ir.Var]*ir.Buffer{}
	for _, p := range params {
		if b, ok := s.f.BufferMap[p]; ok {
			bufMap[p] = b
			args = append(args, b.Data)
		} else {
			args = append(args, p)
		}
	}
	// Host variables become fresh kernel parameters, so host and kernel
	// never share a variable.
	if len(extra) > 0 {
		vmap := map[*ir.Var]ir.Expr{}
		for _, v := range extra {
			nv := ir.NewVar(v.Name, v.Type)
			vmap[v] = nv
			params = append(params, nv)
			args = append(args, v)
		}
		kernelBody = ir.Substitute(kernelBody, vmap)
	}
	attrs := maps.Clone(s.f.Attrs)
	if attrs == nil {
		attrs = map[string]any{}
	}
	delete(attrs, AttrDeviceType)
	attrs[ir.AttrGlobalSymbol] = sym
	attrs[AttrDeviceKernel] = true
	s.kernels[id] = &ir.PrimFunc{Params: params, BufferMap: bufMap, Body: kernelBody, RetType: ir.Void, Attrs: attrs}
	s.launches[id] = l
	call := ir.NewCallExtern(ir.Int32, LaunchPrefix+sym, args...)
	return &ir.AssertStmt{Cond: ir.EQ(call, ir.NewIntImm(ir.Int32, 0)), Message: KeepLastError}
}

// serialVirtualThreads turns loops bound to virtual threads ("vthread",
// "vthread.x"…) into serial loops: each thread runs every virtual
// thread's iterations in turn, as the interpreter does.
func serialVirtualThreads(f *ir.PrimFunc) *ir.PrimFunc {
	found := false
	ir.Visit(f.Body, func(n ir.Node) bool {
		if l, ok := n.(*ir.For); ok && l.Kind == ir.ForThreadBinding && strings.HasPrefix(l.ThreadTag, "vthread") {
			found = true
		}
		return !found
	})
	if !found {
		return f
	}
	r := &ir.Rewriter{Stmt: func(s ir.Stmt) ir.Stmt {
		if l, ok := s.(*ir.For); ok && l.Kind == ir.ForThreadBinding && strings.HasPrefix(l.ThreadTag, "vthread") {
			c := *l
			c.Kind, c.ThreadTag = ir.ForSerial, ""
			return &c
		}
		return s
	}}
	return f.WithBody(r.RewriteStmt(f.Body))
}

// freeVars lists the variables s uses but does not define, in order of
// first use.
func freeVars(s ir.Stmt) []*ir.Var {
	defined := map[*ir.Var]bool{}
	seen := map[*ir.Var]bool{}
	var out []*ir.Var
	use := func(v *ir.Var) {
		if v != nil && !seen[v] {
			seen[v] = true
			out = append(out, v)
		}
	}
	ir.Visit(s, func(n ir.Node) bool {
		switch n := n.(type) {
		case *ir.For:
			defined[n.Var] = true
		case *ir.LetStmt:
			defined[n.Var] = true
		case *ir.Let:
			defined[n.Var] = true
		case *ir.Allocate:
			defined[n.Buffer.Data] = true
		case *ir.BufferLoad:
			use(n.Buffer.Data)
		case *ir.BufferStore:
			use(n.Buffer.Data)
		case *ir.Var:
			use(n)
		}
		return true
	})
	res := out[:0]
	for _, v := range out {
		if !defined[v] {
			res = append(res, v)
		}
	}
	return res
}
