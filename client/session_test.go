package client

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/kiln-ml/kiln/devices"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/ndarray"
	"github.com/kiln-ml/kiln/rpcserver"
	"github.com/kiln-ml/kiln/rpcserver/proto"
)

// The tracker half's Registrar plugs into the device daemon.
var (
	_ rpcserver.Tracker         = (*Registrar)(nil)
	_ rpcserver.FailureReporter = (*Registrar)(nil)
	_ rpcserver.Runner          = (*Registrar)(nil)
)

func TestValueOf(t *testing.T) {
	s := &Session{}
	arr := &Array{s: s, Handle: 4}
	fn := &Func{s: s, Handle: 5}
	tests := []struct {
		name string
		in   any
		want proto.Value
	}{
		{"nil", nil, proto.Value{Kind: proto.KindNil}},
		{"int", 3, proto.Value{Kind: proto.KindInt, Int: 3}},
		{"int32", int32(-3), proto.Value{Kind: proto.KindInt, Int: -3}},
		{"bool", true, proto.Value{Kind: proto.KindInt, Int: 1}},
		{"float32", float32(0.5), proto.Value{Kind: proto.KindFloat, Float: 0.5}},
		{"string", "x", proto.Value{Kind: proto.KindString, Str: "x"}},
		{"bytes", []byte{1}, proto.Value{Kind: proto.KindBytes, Bytes: []byte{1}}},
		{"shape", ndarray.Shape{2, 3}, proto.Value{Kind: proto.KindShape, Shape: []int64{2, 3}}},
		{"dtype", ndarray.Float32, proto.Value{Kind: proto.KindDType, Str: "float32"}},
		{"device", devices.CPUDevice, proto.Value{Kind: proto.KindDevice, Str: "cpu:0"}},
		{"array", arr, proto.Value{Kind: proto.KindArray, Handle: 4}},
		{"func", fn, proto.Value{Kind: proto.KindFunc, Handle: 5}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := valueOf(tc.in)
			check.NoError(t, err)
			check.Equal(t, got, tc.want)
		})
	}
	_, err := valueOf(struct{}{})
	check.ErrorIs(t, err, proto.ErrBadRequest)
	_, err = valueOf(uint64(1))
	check.Error(t, err, "uint64")
}

func TestFromWire(t *testing.T) {
	s := &Session{}
	tests := []struct {
		name string
		in   proto.Value
		want any
	}{
		{"nil", proto.Value{Kind: proto.KindNil}, nil},
		{"int", proto.Value{Kind: proto.KindInt, Int: 9}, int64(9)},
		{"float", proto.Value{Kind: proto.KindFloat, Float: 1.5}, 1.5},
		{"dtype", proto.Value{Kind: proto.KindDType, Str: "int8"}, ndarray.Int8},
		{"device", proto.Value{Kind: proto.KindDevice, Str: "cpu:0"}, devices.CPUDevice},
		{"array", proto.Value{Kind: proto.KindArray, Handle: 2, Array: &proto.ArrayInfo{Handle: 2, Shape: []int64{3}, DType: "float64", Device: "cpu:0", Bytes: 24}},
			&Array{s: s, Handle: 2, Shape: ndarray.Shape{3}, DType: ndarray.Float64, Device: devices.CPUDevice, Bytes: 24}},
		{"func", proto.Value{Kind: proto.KindFunc, Handle: 7, Func: &proto.FuncInfo{Handle: 7, Name: "f"}}, &Func{s: s, Handle: 7, Name: "f"}},
		{"tuple", proto.Value{Kind: proto.KindTuple, Fields: []proto.Value{{Kind: proto.KindInt, Int: 1}, {Kind: proto.KindTuple}}}, []any{int64(1), []any{}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := s.fromWire(tc.in)
			check.NoError(t, err)
			check.Equal(t, got, tc.want)
		})
	}
	_, err := s.fromWire(proto.Value{Kind: "list"})
	check.ErrorIs(t, err, proto.ErrBadRequest)
	_, err = s.fromWire(proto.Value{Kind: proto.KindTuple, Fields: []proto.Value{{Kind: "list"}}})
	check.ErrorIs(t, err, proto.ErrBadRequest)
	_, err = s.fromWire(proto.Value{Kind: proto.KindArray})
	check.ErrorIs(t, err, proto.ErrBadRequest)
}

func TestExplain(t *testing.T) {
	lost := fmt.Errorf("call: %w", &proto.WireError{Code: proto.CodeUnavailable, Message: "connection lost"})
	t.Run("crash is remembered", func(t *testing.T) {
		s := &Session{info: SessionInfo{ID: "s1", ExpiresAt: time.Now().Add(time.Hour).UnixNano()}}
		crash := fmt.Errorf("call %q: %w", "f", &proto.WireError{Code: proto.CodeCrashed, Message: "signal SIGSEGV"})
		check.ErrorIs(t, s.explain(crash), proto.ErrCrashed)
		check.ErrorIs(t, s.ended(), proto.ErrCrashed)
		err := s.explain(lost)
		check.ErrorIs(t, err, proto.ErrCrashed)
		check.Error(t, err, "SIGSEGV", "closed the connection")
	})
	t.Run("lost past the deadline is expiry", func(t *testing.T) {
		s := &Session{info: SessionInfo{ID: "s2", ExpiresAt: time.Now().Add(-time.Second).UnixNano()}}
		err := s.explain(lost)
		check.ErrorIs(t, err, proto.ErrSessionExpired)
		check.ErrorIs(t, err, proto.ErrUnavailable)
	})
	t.Run("lost before the deadline stays lost", func(t *testing.T) {
		s := &Session{info: SessionInfo{ID: "s3", ExpiresAt: time.Now().Add(time.Hour).UnixNano()}}
		err := s.explain(lost)
		check.ErrorIs(t, err, proto.ErrUnavailable)
		check.True(t, !errors.Is(err, proto.ErrSessionExpired), err)
	})
}

func TestConnectRefused(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// Nothing listens on port 1 of loopback.
	_, err := Connect(ctx, "127.0.0.1:1", SessionOptions{})
	check.ErrorIs(t, err, proto.ErrUnavailable)
	check.Error(t, err, "connect to device 127.0.0.1:1")
}
