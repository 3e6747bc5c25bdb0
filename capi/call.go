package main

/*
#include <stdlib.h>
#include "support.h"
*/
import "C"

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"unsafe"

	"github.com/kiln-ml/kiln/client"
	"github.com/kiln-ml/kiln/devices"
	"github.com/kiln-ml/kiln/devices/cpu"
	"github.com/kiln-ml/kiln/ndarray"
	"github.com/kiln-ml/kiln/packedfunc"
	"github.com/kiln-ml/kiln/rpcserver/proto"
	"github.com/kiln-ml/kiln/rpcserver/timer"
)

// Value type codes of kiln.h.
const (
	codeInt   = 0
	codeFloat = 2
	codeNull  = 4
	codeArray = 7
	codeStr   = 11
	codeTuple = 20
	codeFunc  = 21
)

// tuple is a tuple result; its fields are values of the call's session.
type tuple struct {
	fields []any // int64, float64, nil, string, object
}

func (t *tuple) kind() string { return "tuple" }
func (t *tuple) free() {
	for _, f := range t.fields {
		if o, ok := f.(object); ok {
			o.free()
		}
	}
}

// argSlot reads argument i.
func argSlot(args *C.KilnArg, i int) unsafe.Pointer {
	return unsafe.Add(unsafe.Pointer(args), i*int(unsafe.Sizeof(C.KilnArg{})))
}

// remoteArgs converts C arguments for a call in session r.
func remoteArgs(r *remoteSession, args *C.KilnArg, codes *C.int32_t, n int) ([]any, error) {
	if n < 0 || n > 1<<16 || (n > 0 && (args == nil || codes == nil)) {
		return nil, badArg("bad argument list (%d arguments)", n)
	}
	out := make([]any, n)
	cs := unsafe.Slice((*int32)(unsafe.Pointer(codes)), n)
	for i := range n {
		slot := argSlot(args, i)
		switch cs[i] {
		case codeInt:
			out[i] = *(*int64)(slot)
		case codeFloat:
			out[i] = *(*float64)(slot)
		case codeNull:
			out[i] = nil
		case codeStr:
			out[i] = gostr(*(**C.char)(slot))
		case codeBytes:
			out[i] = spanBytes(slot)
		case codeShape:
			out[i] = spanShape(slot)
		case codeFunc:
			f, err := lookup[*remoteFunc](C.KilnHandle(*(*uint64)(slot)), "function")
			if err != nil || f.r != r {
				return nil, badArg("argument %d: not a function of this session", i)
			}
			out[i] = f.f
		case codeArray:
			h := C.KilnHandle(*(*uint64)(slot))
			o, err := arrayOf(h)
			if err != nil {
				return nil, badArg("argument %d: %v", i, err)
			}
			a, ok := o.(*remoteArray)
			if !ok || a.r != r {
				return nil, badArg("argument %d: array handle %d belongs to another session; copy it through the host", i, h)
			}
			out[i] = a.a
		default:
			return nil, badArg("argument %d: unknown type code %d", i, cs[i])
		}
	}
	return out, nil
}

// localArgs converts C arguments for a call in local session l.
func localArgs(args *C.KilnArg, codes *C.int32_t, n int) ([]packedfunc.Value, error) {
	if n < 0 || n > 1<<16 || (n > 0 && (args == nil || codes == nil)) {
		return nil, badArg("bad argument list (%d arguments)", n)
	}
	out := make([]packedfunc.Value, n)
	cs := unsafe.Slice((*int32)(unsafe.Pointer(codes)), n)
	for i := range n {
		slot := argSlot(args, i)
		switch cs[i] {
		case codeInt:
			out[i] = packedfunc.Int(*(*int64)(slot))
		case codeFloat:
			out[i] = packedfunc.Float(*(*float64)(slot))
		case codeNull:
			out[i] = packedfunc.Nil
		case codeStr:
			out[i] = packedfunc.String(gostr(*(**C.char)(slot)))
		case codeBytes:
			out[i] = packedfunc.Bytes(spanBytes(slot))
		case codeShape:
			out[i] = packedfunc.ShapeValue(spanShape(slot))
		case codeFunc:
			f, err := lookup[*localFunc](C.KilnHandle(*(*uint64)(slot)), "function")
			if err != nil {
				return nil, badArg("argument %d: not a function of this session", i)
			}
			out[i] = packedfunc.FuncValue(f.f)
		case codeArray:
			h := C.KilnHandle(*(*uint64)(slot))
			o, err := arrayOf(h)
			if err != nil {
				return nil, badArg("argument %d: %v", i, err)
			}
			a, ok := o.(*localArray)
			if !ok {
				return nil, badArg("argument %d: array handle %d is on a remote device, the function runs here", i, h)
			}
			if a.a.Released() {
				return nil, badArg("argument %d: array handle %d: its memory was released", i, h)
			}
			out[i] = packedfunc.Array(a.a)
		default:
			return nil, badArg("argument %d: unknown type code %d", i, cs[i])
		}
	}
	return out, nil
}

// classify says whether a failed call was the caller's fault (arguments
// the function refused) or the session's.
func classify(err error) int {
	var ke *cpu.KernelError
	switch {
	case errors.As(err, &ke):
		return errSession
	case errors.Is(err, proto.ErrBadRequest), errors.Is(err, packedfunc.ErrArity):
		return errArgument
	case errors.Is(err, proto.ErrCrashed), errors.Is(err, proto.ErrSessionExpired), errors.Is(err, proto.ErrUnavailable):
		return errSession
	}
	return errSession
}

//export kiln_call
func kiln_call(h C.KilnHandle, args *C.KilnArg, codes *C.int32_t, n C.int32_t, cancel C.KilnHandle, ret *C.KilnArg, retCode *C.int32_t) C.int {
	handles.RLock()
	o := handles.m[uint64(h)]
	handles.RUnlock()
	var res any
	switch f := o.(type) {
	case *localFunc:
		if err := f.l.check(); err != nil {
			return fail(err, errSession)
		}
		vals, err := localArgs(args, codes, int(n))
		if err != nil {
			return fail(fmt.Errorf("call %q: %w", f.f.Name(), err), errArgument)
		}
		v, err := f.f.Call(vals...)
		if err != nil {
			var ke *cpu.KernelError
			if errors.As(err, &ke) {
				return fail(err, errSession)
			}
			return fail(&argError{msg: err.Error(), cause: err}, errArgument)
		}
		if res, err = fromLocal(f.l, v); err != nil {
			return fail(err, errSession)
		}
	case *remoteFunc:
		ctx, err := contextOf(cancel)
		if err != nil {
			return fail(err, errArgument)
		}
		if err := f.r.check(); err != nil {
			return fail(err, errSession)
		}
		in, err := remoteArgs(f.r, args, codes, int(n))
		if err != nil {
			return fail(fmt.Errorf("call %q: %w", f.f.Name, err), errArgument)
		}
		v, err := f.f.Call(ctx, in...)
		if err != nil {
			return fail(err, classify(err))
		}
		res = fromRemote(f.r, v)
	default:
		_, err := lookup[*remoteFunc](h, "function")
		return fail(err, errArgument)
	}
	return putResult(res, ret, retCode)
}

// fromLocal converts a local call's result.
func fromLocal(l *localSession, v packedfunc.Value) (any, error) {
	switch v.Kind() {
	case packedfunc.KindNil:
		return nil, nil
	case packedfunc.KindInt:
		return v.AsInt()
	case packedfunc.KindFloat:
		return v.AsFloat()
	case packedfunc.KindString:
		return v.AsString()
	case packedfunc.KindBytes:
		b, _ := v.AsBytes()
		return newBytesBlob(b), nil
	case packedfunc.KindShape:
		s, _ := v.AsShape()
		return newShapeBlob(s), nil
	case packedfunc.KindNDArray:
		a, _ := v.AsArray()
		return &localArray{l: l, a: a, refs: 1}, nil
	case packedfunc.KindFunc:
		f, _ := v.AsFunc()
		return &localFunc{l: l, f: f}, nil
	case packedfunc.KindTuple:
		fs, _ := v.AsTuple()
		t := &tuple{}
		for _, f := range fs {
			x, err := fromLocal(l, f)
			if err != nil {
				t.free()
				return nil, err
			}
			t.fields = append(t.fields, x)
		}
		return t, nil
	}
	return nil, fmt.Errorf("a %s result cannot be passed through the C API", v.Kind())
}

// fromRemote converts a remote call's result.
func fromRemote(r *remoteSession, v any) any {
	switch x := v.(type) {
	case *client.Array:
		return &remoteArray{r: r, a: x}
	case *client.Func:
		return &remoteFunc{r: r, f: x}
	case *client.Module:
		return &remoteModule{r: r, m: x}
	case []any:
		t := &tuple{}
		for _, f := range x {
			t.fields = append(t.fields, fromRemote(r, f))
		}
		return t
	case ndarray.Shape:
		return newShapeBlob(x)
	case ndarray.DType, devices.Device:
		return fmt.Sprint(x)
	case []byte:
		return newBytesBlob(x)
	}
	return v
}

// putResult stores a result, making handles for objects.
func putResult(v any, ret *C.KilnArg, code *C.int32_t) C.int {
	if ret == nil || code == nil {
		if o, ok := v.(object); ok {
			o.free()
		}
		if ret == nil && code == nil {
			return 0
		}
		return fail(badArg("no place for the result (NULL)"), errArgument)
	}
	slot := unsafe.Pointer(ret)
	switch x := v.(type) {
	case nil:
		*code = codeNull
		*(*int64)(slot) = 0
	case int64:
		*code = codeInt
		*(*int64)(slot) = x
	case float64:
		*code = codeFloat
		*(*float64)(slot) = x
	case string:
		*code = codeStr
		*(**C.char)(slot) = C.CString(x)
	case *tuple:
		*code = codeTuple
		*(*uint64)(slot) = uint64(newHandle(x))
	case *remoteArray, *localArray:
		*code = codeArray
		*(*uint64)(slot) = uint64(newHandle(x.(object)))
	case *remoteFunc, *localFunc:
		*code = codeFunc
		*(*uint64)(slot) = uint64(newHandle(x.(object)))
	case *blob:
		*code = codeBytes
		if x.isShp {
			*code = codeShape
		}
		*(*uint64)(slot) = uint64(newHandle(x))
	case object:
		x.free()
		return fail(fmt.Errorf("a %s result cannot be passed through the C API", x.kind()), errSession)
	default:
		return fail(fmt.Errorf("a %T result cannot be passed through the C API", v), errSession)
	}
	return 0
}

//export kiln_tuple_size
func kiln_tuple_size(h C.KilnHandle, out *C.int32_t) C.int {
	t, err := lookup[*tuple](h, "tuple")
	if err != nil {
		return fail(err, errArgument)
	}
	if out == nil {
		return fail(badArg("no place for the size (NULL)"), errArgument)
	}
	*out = C.int32_t(len(t.fields))
	return 0
}

// kiln_tuple_get returns field i; an object field gets a new handle that
// shares it (freeing either leaves the other usable until both are freed
// only for local arrays; remote fields stay valid until the tuple is freed).
//
//export kiln_tuple_get
func kiln_tuple_get(h C.KilnHandle, i C.int32_t, ret *C.KilnArg, code *C.int32_t) C.int {
	t, err := lookup[*tuple](h, "tuple")
	if err != nil {
		return fail(err, errArgument)
	}
	if i < 0 || int(i) >= len(t.fields) {
		return fail(badArg("tuple field %d of %d", i, len(t.fields)), errArgument)
	}
	f := t.fields[i]
	switch x := f.(type) {
	case *localArray:
		x.ref()
		return putResult(x, ret, code)
	case *remoteArray:
		return putResult(&borrowed{x, "array"}, ret, code)
	case object:
		return putResult(&borrowed{x, x.kind()}, ret, code)
	}
	return putResult(f, ret, code)
}

// borrowed is a handle to an object another handle (a tuple) owns.
type borrowed struct {
	object
	k string
}

func (b *borrowed) kind() string { return b.k }
func (b *borrowed) free()        {}

//export kiln_time_evaluator
func kiln_time_evaluator(h C.KilnHandle, args *C.KilnArg, codes *C.int32_t, n C.int32_t, number, repeat, minRepeatMS C.int32_t, cancel C.KilnHandle, out **C.char) C.int {
	if number < 0 || repeat < 0 || minRepeatMS < 0 {
		return fail(badArg("time evaluator: number %d, repeat %d, min_repeat_ms %d: none may be negative", number, repeat, minRepeatMS), errArgument)
	}
	o := proto.TimeOptions{Number: int(number), Repeat: int(repeat), MinRepeatMS: int(minRepeatMS)}
	return timeEvaluator(h, args, codes, n, o, cancel, out)
}

// kiln_time_evaluator_options is kiln_time_evaluator with every option of
// TVM's time_evaluator, as JSON: number, repeat, min_repeat_ms,
// limit_zero_time_iterations, cooldown_interval_ms, repeats_to_cooldown,
// cache_flush_bytes and f_preproc (the name of a global function of the
// session run before each repeat).
//
//export kiln_time_evaluator_options
func kiln_time_evaluator_options(h C.KilnHandle, args *C.KilnArg, codes *C.int32_t, n C.int32_t, options *C.char, cancel C.KilnHandle, out **C.char) C.int {
	var o proto.TimeOptions
	dec := json.NewDecoder(strings.NewReader(gostr(options)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&o); err != nil {
		return fail(badArg("time evaluator options: %v", err), errArgument)
	}
	if o.Number < 0 || o.Repeat < 0 || o.MinRepeatMS < 0 || o.LimitZeroTimeIterations < 0 || o.CooldownIntervalMS < 0 || o.RepeatsToCooldown < 0 || o.CacheFlushBytes < 0 {
		return fail(badArg("time evaluator options %s: none may be negative", gostr(options)), errArgument)
	}
	return timeEvaluator(h, args, codes, n, o, cancel, out)
}

func timeEvaluator(h C.KilnHandle, args *C.KilnArg, codes *C.int32_t, n C.int32_t, o proto.TimeOptions, cancel C.KilnHandle, out **C.char) C.int {
	ctx, err := contextOf(cancel)
	if err != nil {
		return fail(err, errArgument)
	}
	if out == nil {
		return fail(badArg("no place for the result (NULL)"), errArgument)
	}
	handles.RLock()
	obj := handles.m[uint64(h)]
	handles.RUnlock()
	var res proto.TimeResult
	switch f := obj.(type) {
	case *localFunc:
		if err := f.l.check(); err != nil {
			return fail(err, errSession)
		}
		vals, err := localArgs(args, codes, int(n))
		if err != nil {
			return fail(fmt.Errorf("time %q: %w", f.f.Name(), err), errArgument)
		}
		if res, err = timeLocal(ctx, f.f, vals, o); err != nil {
			var ke *cpu.KernelError
			if errors.As(err, &ke) || errors.Is(err, context.Canceled) {
				return fail(err, errSession)
			}
			return fail(&argError{msg: err.Error(), cause: err}, errArgument)
		}
	case *remoteFunc:
		if err := f.r.check(); err != nil {
			return fail(err, errSession)
		}
		in, err := remoteArgs(f.r, args, codes, int(n))
		if err != nil {
			return fail(fmt.Errorf("time %q: %w", f.f.Name, err), errArgument)
		}
		if res, err = f.r.s.TimeEvaluator(ctx, f.f, o, in...); err != nil {
			return fail(err, classify(err))
		}
	default:
		_, err := lookup[*remoteFunc](h, "function")
		return fail(err, errArgument)
	}
	b, err := json.Marshal(res)
	if err != nil {
		return fail(err, errInternal)
	}
	return outString(out, string(b))
}

// timeLocal runs the time evaluator here, as the device daemon does.
func timeLocal(ctx context.Context, f *packedfunc.Func, args []packedfunc.Value, o proto.TimeOptions) (proto.TimeResult, error) {
	ev := timer.Evaluator{Call: func() error {
		_, err := f.Call(args...)
		return err
	}}
	if o.Preproc != "" {
		pre, err := packedfunc.Get(o.Preproc)
		if err != nil {
			return proto.TimeResult{}, fmt.Errorf("time evaluator: f_preproc: %w", err)
		}
		ev.Preproc = func() error {
			_, err := pre.Call(args...)
			return err
		}
	}
	r, err := ev.Evaluate(ctx, timer.OptionsOf(o))
	if err != nil {
		return proto.TimeResult{}, err
	}
	return r.Wire(devices.CPUDevice.String()), nil
}

// offThread runs a blocking remote operation on a goroutine of its own and
// waits for it. The goroutine that runs a C caller's call is locked to the
// caller's thread, so every wake-up of it (each reply, each window update
// of a bulk copy) is a hand-over to that one thread; a goroutine of its own
// is woken wherever the scheduler likes, and the caller is woken once.
func offThread[T any](fn func() (T, error)) (T, error) {
	type result struct {
		v   T
		err error
	}
	ch := make(chan result, 1)
	go func() {
		v, err := fn()
		ch <- result{v, err}
	}()
	r := <-ch
	return r.v, r.err
}
