package rpcserver

import (
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/kiln-ml/kiln/devices"
	"github.com/kiln-ml/kiln/devices/cpu"
	"github.com/kiln-ml/kiln/ndarray"
	"github.com/kiln-ml/kiln/packedfunc"
	"github.com/kiln-ml/kiln/rpcserver/proto"
)

// toPacked converts a wire argument; an argument that names a handle
// returns the object it holds (to be released after the call).
func (w *worker) toPacked(v proto.Value) (packedfunc.Value, *object, error) {
	switch v.Kind {
	case proto.KindNil, "":
		return packedfunc.Nil, nil, nil
	case proto.KindInt:
		return packedfunc.Int(v.Int), nil, nil
	case proto.KindFloat:
		return packedfunc.Float(v.Float), nil, nil
	case proto.KindString:
		return packedfunc.String(v.Str), nil, nil
	case proto.KindBytes:
		return packedfunc.Bytes(v.Bytes), nil, nil
	case proto.KindShape:
		return packedfunc.ShapeValue(ndarray.Shape(v.Shape)), nil, nil
	case proto.KindDType:
		dt, err := ndarray.ParseDType(v.Str)
		if err != nil {
			return packedfunc.Nil, nil, fmt.Errorf("%v: %w", err, proto.ErrBadRequest)
		}
		return packedfunc.DTypeValue(dt), nil, nil
	case proto.KindDevice:
		dev, err := devices.ParseDevice(v.Str)
		if err != nil {
			return packedfunc.Nil, nil, fmt.Errorf("%v: %w", err, proto.ErrBadRequest)
		}
		return packedfunc.DeviceValue(dev), nil, nil
	case proto.KindArray:
		o, err := w.h.acquire(v.Handle, proto.KindArray)
		if err != nil {
			return packedfunc.Nil, nil, err
		}
		return packedfunc.Array(o.arr), o, nil
	case proto.KindFunc:
		o, err := w.h.acquire(v.Handle, proto.KindFunc)
		if err != nil {
			return packedfunc.Nil, nil, err
		}
		return packedfunc.FuncValue(o.fn), o, nil
	case proto.KindModule:
		o, err := w.h.acquire(v.Handle, proto.KindModule)
		if err != nil {
			return packedfunc.Nil, nil, err
		}
		return packedfunc.ModuleValue(o.mod), o, nil
	}
	return packedfunc.Nil, nil, fmt.Errorf("unknown value kind %q: %w", v.Kind, proto.ErrBadRequest)
}

// fromPacked converts a result for the wire. A returned array, function or
// module gets a handle of its own, unless it is one of the call's
// arguments, whose handle it keeps.
func (w *worker) fromPacked(v packedfunc.Value, cs *callSetup) proto.Value {
	switch v.Kind() {
	case packedfunc.KindTuple:
		fields, _ := v.AsTuple()
		out := proto.Value{Kind: proto.KindTuple, Fields: make([]proto.Value, len(fields))}
		for i, f := range fields {
			out.Fields[i] = w.fromPacked(f, cs)
		}
		return out
	case packedfunc.KindInt:
		n, _ := v.AsInt()
		return proto.Value{Kind: proto.KindInt, Int: n}
	case packedfunc.KindFloat:
		f, _ := v.AsFloat()
		return proto.Value{Kind: proto.KindFloat, Float: f}
	case packedfunc.KindString:
		s, _ := v.AsString()
		return proto.Value{Kind: proto.KindString, Str: s}
	case packedfunc.KindBytes:
		b, _ := v.AsBytes()
		return proto.Value{Kind: proto.KindBytes, Bytes: b}
	case packedfunc.KindShape:
		s, _ := v.AsShape()
		return proto.Value{Kind: proto.KindShape, Shape: append([]int64{}, s...)}
	case packedfunc.KindDType:
		d, _ := v.AsDType()
		return proto.Value{Kind: proto.KindDType, Str: d.String()}
	case packedfunc.KindDevice:
		d, _ := v.AsDevice()
		return proto.Value{Kind: proto.KindDevice, Str: d.String()}
	case packedfunc.KindNDArray:
		arr, _ := v.AsArray()
		h := w.findHandle(cs, func(o *object) bool { return o.arr == arr })
		if h == 0 {
			h = w.h.add(&object{kind: proto.KindArray, arr: arr})
		}
		return proto.Value{Kind: proto.KindArray, Handle: h, Array: arrayInfo(h, arr)}
	case packedfunc.KindFunc:
		fn, _ := v.AsFunc()
		h := w.findHandle(cs, func(o *object) bool { return o.fn == fn })
		if h == 0 {
			h = w.h.add(&object{kind: proto.KindFunc, name: fn.Name(), fn: fn})
		}
		return proto.Value{Kind: proto.KindFunc, Handle: h, Func: &proto.FuncInfo{Handle: h, Name: fn.Name()}}
	case packedfunc.KindModule:
		m, _ := v.AsModule()
		h := w.findHandle(cs, func(o *object) bool { return o.mod == m })
		if h == 0 {
			h = w.h.add(&object{kind: proto.KindModule, mod: m})
		}
		return proto.Value{Kind: proto.KindModule, Handle: h, Module: &proto.ModuleInfo{Handle: h, Type: m.Type(), Functions: m.Functions()}}
	}
	return proto.Value{Kind: proto.KindNil}
}

// findHandle returns the handle of a live object of the call's arguments
// that matches, or 0.
func (w *worker) findHandle(cs *callSetup, match func(*object) bool) uint64 {
	w.h.mu.Lock()
	defer w.h.mu.Unlock()
	for h, o := range w.h.objs {
		for _, held := range cs.held[1:] {
			if o == held && match(o) {
				return h
			}
		}
	}
	return 0
}

// CollectDeviceAttrs describes this machine's host CPU and every device of
// every registered backend, with the attributes each backend reports.
func CollectDeviceAttrs() proto.DeviceAttrsResult {
	info := cpu.Info()
	r := proto.DeviceAttrsResult{
		Host: proto.HostInfo{Model: info.Model, Arch: info.Arch, Triple: info.Triple, Cores: info.Cores,
			Features: append([]string{}, info.Features...)},
		Devices: []proto.DeviceInfo{},
		Absent:  map[string]string{},
	}
	for t, why := range devices.AbsentTypes() {
		r.Absent[t.String()] = why
	}
	for _, api := range devices.Registered() {
		n := api.Count()
		if n == 0 {
			if _, ok := r.Absent[api.Type().String()]; !ok {
				r.Absent[api.Type().String()] = "backend loaded, no device present"
			}
			continue
		}
		for id := 0; id < n; id++ {
			dev := devices.Device{Type: api.Type(), ID: int32(id)}
			d := proto.DeviceInfo{Device: dev.String(), Type: dev.Type.String(), Attrs: map[string]any{}}
			for _, k := range devices.AllAttrs() {
				v, err := api.Attr(dev, k)
				if err != nil {
					if !errors.Is(err, devices.ErrUnsupportedAttr) {
						d.Attrs[k.String()+"_error"] = err.Error()
					}
					continue
				}
				d.Attrs[k.String()] = v
			}
			r.Devices = append(r.Devices, d)
		}
	}
	return r
}

// NodeAttrs describes this machine for a tracker registration
// (proto.RegisterArgs.Attrs): device types and names, memory, CUDA compute
// capability, CPU model and features, target triple, and version.
func NodeAttrs(version string) proto.NodeAttrs {
	r := CollectDeviceAttrs()
	a := proto.NodeAttrs{
		CPUModel: r.Host.Model, CPUFeatures: r.Host.Features, CPUCores: r.Host.Cores,
		Triple: r.Host.Triple, KilnVersion: version,
	}
	seen := map[string]bool{}
	for _, d := range r.Devices {
		if !seen[d.Type] {
			seen[d.Type] = true
			a.DeviceTypes = append(a.DeviceTypes, d.Type)
		}
		if name, ok := d.Attrs[devices.AttrName.String()].(string); ok && name != "" {
			a.DeviceNames = append(a.DeviceNames, name)
		}
		if d.Type != devices.CPU.String() {
			if mem, ok := d.Attrs[devices.AttrTotalGlobalMemory.String()].(int64); ok && mem > a.MemoryBytes {
				a.MemoryBytes = mem
			}
			if cv, ok := d.Attrs[devices.AttrComputeVersion.String()].(string); ok && a.CUDACompute == "" && d.Type == devices.CUDA.String() {
				a.CUDACompute = cv
			}
		}
	}
	if a.MemoryBytes == 0 {
		for _, d := range r.Devices {
			if mem, ok := d.Attrs[devices.AttrTotalGlobalMemory.String()].(int64); ok && d.Type == devices.CPU.String() {
				a.MemoryBytes = mem
			}
		}
	}
	sort.Strings(a.DeviceTypes)
	a.DeviceNames = compactStrings(a.DeviceNames)
	return a
}

func compactStrings(s []string) []string {
	out := s[:0]
	seen := map[string]bool{}
	for _, v := range s {
		v = strings.TrimSpace(v)
		if v != "" && !seen[v] {
			seen[v] = true
			out = append(out, v)
		}
	}
	return out
}
