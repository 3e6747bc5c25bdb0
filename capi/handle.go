package main

/*
#include <stdlib.h>
#include "support.h"
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"

	"github.com/kiln-ml/kiln/ndarray"
	"github.com/kiln-ml/kiln/packedfunc"
	"github.com/kiln-ml/kiln/rpcserver/proto"
)

// Error classes of kiln.h.
const (
	errArgument  = 1
	errTracker   = 2
	errSession   = 3
	errBuild     = 4
	errCancelled = 5
	errInternal  = 6
)

// object is what a handle names. free releases what it holds; it is called
// once, by kiln_free.
type object interface {
	kind() string
	free()
}

// handles is the table of live handles.
var handles = struct {
	sync.RWMutex
	next uint64
	m    map[uint64]object
	// freed remembers what each freed handle was, so using it again says
	// so instead of "no such handle" (bounded: oldest forgotten first).
	freed     map[uint64]string
	freedList []uint64
}{m: map[uint64]object{}, freed: map[uint64]string{}}

const freedMemory = 1 << 16

func newHandle(o object) C.KilnHandle {
	handles.Lock()
	handles.next++
	h := handles.next
	handles.m[h] = o
	handles.Unlock()
	return C.KilnHandle(h)
}

// argError is an error in what the caller passed.
type argError struct {
	msg   string
	cause error // what it wraps (for kiln_last_error_code), or nil
}

func (e *argError) Error() string { return e.msg }
func (e *argError) Unwrap() error { return e.cause }

func badArg(format string, a ...any) error { return &argError{msg: fmt.Sprintf(format, a...)} }

// lookup returns the object behind h as a T, or an error naming what was
// wrong (0, freed, unknown, another kind).
func lookup[T object](h C.KilnHandle, want string) (T, error) {
	var zero T
	if h == 0 {
		return zero, badArg("no %s given (handle 0)", want)
	}
	handles.RLock()
	o, ok := handles.m[uint64(h)]
	was := handles.freed[uint64(h)]
	handles.RUnlock()
	if !ok {
		if was != "" {
			return zero, badArg("%s handle %d was freed and cannot be used again", was, h)
		}
		return zero, badArg("%s handle %d does not exist", want, h)
	}
	t, ok := o.(T)
	if !ok {
		return zero, badArg("handle %d is a %s, not a %s", h, o.kind(), want)
	}
	return t, nil
}

//export kiln_free
func kiln_free(h C.KilnHandle) C.int {
	handles.Lock()
	o, ok := handles.m[uint64(h)]
	if ok {
		delete(handles.m, uint64(h))
		handles.freed[uint64(h)] = o.kind()
		handles.freedList = append(handles.freedList, uint64(h))
		if len(handles.freedList) > freedMemory {
			delete(handles.freed, handles.freedList[0])
			handles.freedList = handles.freedList[1:]
		}
	}
	handles.Unlock()
	if !ok {
		_, err := lookup[object](h, "object")
		return fail(err, errArgument)
	}
	o.free()
	return 0
}

//export kiln_live_handles
func kiln_live_handles() C.int64_t {
	handles.RLock()
	defer handles.RUnlock()
	return C.int64_t(len(handles.m))
}

// fail records err as the calling thread's last error and returns -1. The
// class is kind unless the error says otherwise (a bad argument, a
// cancellation).
func fail(err error, kind int) C.int {
	var ae *argError
	switch {
	case errors.As(err, &ae), errors.Is(err, proto.ErrBadRequest), errors.Is(err, ndarray.ErrBadDType),
		errors.Is(err, ndarray.ErrReleased), errors.Is(err, packedfunc.ErrArity):
		kind = errArgument
	case errors.Is(err, context.Canceled), errors.Is(err, proto.ErrCancelled) && kind != errBuild:
		kind = errCancelled
	}
	C.kiln_set_error(C.CString(err.Error()), C.int(kind))
	C.kiln_set_error_code(C.int(errorCode(err)))
	return -1
}

// cstr returns a malloc'd copy of s.
func cstr(s string) *C.char { return C.CString(s) }

func gostr(p *C.char) string {
	if p == nil {
		return ""
	}
	return C.GoString(p)
}

// outString stores a malloc'd copy of s in *out.
func outString(out **C.char, s string) C.int {
	if out == nil {
		return fail(badArg("no place for the result (NULL)"), errArgument)
	}
	*out = cstr(s)
	return 0
}

// cancelToken is a context that kiln_cancel ends.
type cancelToken struct {
	ctx    context.Context
	cancel context.CancelFunc
}

func (c *cancelToken) kind() string { return "cancel token" }
func (c *cancelToken) free()        { c.cancel() }

//export kiln_cancel_new
func kiln_cancel_new(out *C.KilnHandle) C.int {
	if out == nil {
		return fail(badArg("no place for the token (NULL)"), errArgument)
	}
	ctx, cancel := context.WithCancel(context.Background())
	*out = newHandle(&cancelToken{ctx: ctx, cancel: cancel})
	return 0
}

//export kiln_cancel
func kiln_cancel(h C.KilnHandle) C.int {
	c, err := lookup[*cancelToken](h, "cancel token")
	if err != nil {
		return fail(err, errArgument)
	}
	c.cancel()
	return 0
}

// contextOf is the context of a cancel token (0: never cancelled).
func contextOf(h C.KilnHandle) (context.Context, error) {
	if h == 0 {
		return context.Background(), nil
	}
	c, err := lookup[*cancelToken](h, "cancel token")
	if err != nil {
		return nil, err
	}
	return c.ctx, nil
}

var versionString = C.CString(version())

//export kiln_version
func kiln_version() *C.char { return versionString }

// version is the module version and VCS revision the library was built from.
func version() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	v := info.Main.Version
	if v == "" || v == "(devel)" {
		v = "0.0.0-dev"
	}
	for _, s := range info.Settings {
		if s.Key == "vcs.revision" && len(s.Value) >= 12 {
			v += "+" + s.Value[:12]
		}
	}
	return v
}
