package main

/*
#include <stdlib.h>
#include "support.h"
*/
import "C"

import (
	"errors"
	"os"
	"unsafe"

	"github.com/kiln-ml/kiln/ndarray"
	"github.com/kiln-ml/kiln/packedfunc"
	"github.com/kiln-ml/kiln/rpcserver/proto"
)

// Value type codes of kiln.h beyond the scalars: bytes and shapes. As
// arguments v_handle points to a KilnSpan; as results it is a blob handle
// read with kiln_blob_get.
const (
	codeBytes = 12
	codeShape = 22
)

// blob is a bytes or shape result, held in C memory (the caller reads it
// after the call returns).
type blob struct {
	p     unsafe.Pointer
	n     int // bytes, or dimensions of a shape
	isShp bool
}

func newBytesBlob(b []byte) *blob {
	return &blob{p: C.CBytes(append(b, 0)), n: len(b)}
}

func newShapeBlob(s ndarray.Shape) *blob {
	b := make([]byte, 8*len(s)+8)
	for i, d := range s {
		*(*int64)(unsafe.Pointer(&b[8*i])) = d
	}
	return &blob{p: C.CBytes(b), n: len(s), isShp: true}
}

func (b *blob) kind() string {
	if b.isShp {
		return "shape"
	}
	return "bytes"
}
func (b *blob) free() { C.free(b.p) }

// spanBytes reads a KilnSpan of bytes argument.
func spanBytes(slot unsafe.Pointer) []byte {
	sp := *(**C.KilnSpan)(slot)
	if sp == nil || sp.len <= 0 || sp.data == nil {
		return []byte{}
	}
	return C.GoBytes(sp.data, C.int(sp.len))
}

// spanShape reads a KilnSpan of int64 argument.
func spanShape(slot unsafe.Pointer) ndarray.Shape {
	sp := *(**C.KilnSpan)(slot)
	if sp == nil || sp.len <= 0 || sp.data == nil {
		return ndarray.Shape{}
	}
	return ndarray.Shape(append([]int64{}, unsafe.Slice((*int64)(sp.data), int(sp.len))...))
}

// kiln_blob_get returns a bytes result's bytes (len in bytes) or a shape
// result's dimensions (len of them, int64 each); the memory lives as long
// as the handle.
//
//export kiln_blob_get
func kiln_blob_get(h C.KilnHandle, data *unsafe.Pointer, n *C.int64_t) C.int {
	b, err := lookup[*blob](h, "bytes or shape")
	if err != nil {
		return fail(err, errArgument)
	}
	if data == nil || n == nil {
		return fail(badArg("no place for the blob (NULL)"), errArgument)
	}
	*data, *n = b.p, C.int64_t(b.n)
	return 0
}

// Causes of errors of kiln.h (kiln_last_error_code).
const (
	codeNone = iota
	codeNotFound
	codeSessionExpired
	codeDeadline
	codeCrashed
)

// errorCode is what err says beyond its class.
func errorCode(err error) int {
	switch {
	case errors.Is(err, proto.ErrSessionExpired):
		return codeSessionExpired
	case errors.Is(err, proto.ErrCrashed):
		return codeCrashed
	case errors.Is(err, proto.ErrDeadline):
		return codeDeadline
	case errors.Is(err, proto.ErrNotFound), errors.Is(err, packedfunc.ErrNotFound), errors.Is(err, os.ErrNotExist):
		return codeNotFound
	}
	return codeNone
}
