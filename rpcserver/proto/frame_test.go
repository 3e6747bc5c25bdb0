package proto

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/kiln-ml/kiln/internal/check"
)

func TestFrameRoundTrip(t *testing.T) {
	args, err := msgpack.Marshal(map[string]int{"n": 3})
	check.NoError(t, err)
	req := Request{ID: 9, Method: "time_evaluator", Args: args, Deadline: 12345}
	var buf bytes.Buffer
	check.NoError(t, WriteFrame(&buf, req, 0))
	check.Equal(t, int(binary.BigEndian.Uint32(buf.Bytes())), buf.Len()-4)
	b, err := ReadFrame(&buf, 0)
	check.NoError(t, err)
	got, err := DecodeRequest(b)
	check.NoError(t, err)
	check.Equal(t, got, req)
	_, err = ReadFrame(&buf, 0)
	check.True(t, err == io.EOF, "clean EOF between frames")

	resp := Response{ID: 9, Result: msgpackNil, Error: &WireError{Code: CodeCrashed, Message: `kernel "f" got SIGSEGV`}}
	check.NoError(t, WriteFrame(&buf, resp, 0))
	b, err = ReadFrame(&buf, 0)
	check.NoError(t, err)
	gotResp, err := DecodeResponse(b)
	check.NoError(t, err)
	check.Equal(t, gotResp, resp)
	check.ErrorIs(t, gotResp.Error, ErrCrashed)

	// A large frame arrives whole.
	big := Request{ID: 1, Method: "m", Args: msgpack.RawMessage(mustMarshal(t, bytes.Repeat([]byte{7}, 3<<20)))}
	check.NoError(t, WriteFrame(&buf, big, 0))
	b, err = ReadFrame(&buf, 0)
	check.NoError(t, err)
	got, err = DecodeRequest(b)
	check.NoError(t, err)
	check.Equal(t, got, big)
}

func mustMarshal(t testing.TB, v any) []byte {
	t.Helper()
	b, err := msgpack.Marshal(v)
	check.NoError(t, err)
	return b
}

func TestReadFrameErrors(t *testing.T) {
	_, err := ReadFrame(bytes.NewReader([]byte{0, 0, 1, 0}), 255)
	check.ErrorIs(t, err, ErrTooLarge)
	check.Error(t, err, "256 bytes exceed the limit of 255 bytes")

	_, err = ReadFrame(bytes.NewReader([]byte{0, 0}), 0)
	check.ErrorIs(t, err, io.ErrUnexpectedEOF)

	_, err = ReadFrame(bytes.NewReader([]byte{0, 0, 0, 9, 1, 2}), 0)
	check.ErrorIs(t, err, io.ErrUnexpectedEOF)

	// A prefix that claims 60 MiB and delivers 10 bytes fails without
	// allocating the claim.
	claim := binary.BigEndian.AppendUint32(nil, 60<<20)
	allocs := testing.AllocsPerRun(10, func() {
		ReadFrame(bytes.NewReader(append(claim, make([]byte, 10)...)), 0)
	})
	check.True(t, allocs < 10, "allocations", allocs)

	_, err = EncodeFrame(Request{ID: 1, Method: strings.Repeat("m", 100)}, 50)
	check.ErrorIs(t, err, ErrTooLarge)
}

func TestDecodeRequestErrors(t *testing.T) {
	cases := []struct {
		name string
		in   []byte
		want string
	}{
		{"garbage", []byte{0xc1}, "decode request"},
		{"empty", nil, "decode request"},
		{"wrong field type", mustMarshal(t, map[string]any{"id": "one", "method": "m"}), "decode request"},
		{"id zero", mustMarshal(t, map[string]any{"method": "m"}), "id is 0"},
		{"method empty", mustMarshal(t, map[string]any{"id": 3}), "method is empty"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := DecodeRequest(tc.in)
			check.ErrorIs(t, err, ErrBadRequest)
			check.Error(t, err, tc.want)
		})
	}
	// Unknown keys are ignored: a newer peer may add fields.
	req, err := DecodeRequest(mustMarshal(t, map[string]any{"id": 3, "method": "m", "trace": "x"}))
	check.NoError(t, err)
	check.Equal(t, req, Request{ID: 3, Method: "m", Args: msgpackNil})

	_, err = decodeBulkHeader(mustMarshal(t, BulkHeader{ID: 1, Size: -1}))
	check.ErrorIs(t, err, ErrBadRequest)
}

// FuzzDecodeFrame feeds arbitrary bytes to the frame reader and the request
// decoder: they never panic, fail with the errors they document, and what
// they accept encodes back to an equal request.
func FuzzDecodeFrame(f *testing.F) {
	for _, v := range []any{
		Request{ID: 1, Method: "empty", Args: msgpackNil},
		Request{ID: 1 << 60, Method: "upload", Args: msgpack.RawMessage(mustMarshal(f, map[string]any{"name": "a", "n": []int{1, 2}})), Deadline: 1 << 62},
		BulkHeader{ID: 2, Method: "upload", Name: "x", Size: 8},
		Response{ID: 3, Result: msgpackNil, Error: &WireError{Code: CodeBusy, Message: "m"}},
	} {
		b, err := EncodeFrame(v, 0)
		check.NoError(f, err)
		f.Add(b)
	}
	f.Add([]byte{0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{0, 0, 0, 1, 0xc1})
	f.Add([]byte{0, 0, 0, 5, 0xdb, 0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{0, 0, 0, 3, 0x81, 0xa2, 'i'})
	const limit = 1 << 20
	f.Fuzz(func(t *testing.T, data []byte) {
		b, err := ReadFrame(bytes.NewReader(data), limit)
		if err != nil {
			if !errors.Is(err, ErrTooLarge) && !errors.Is(err, io.ErrUnexpectedEOF) && err != io.EOF {
				t.Fatalf("unexpected error %v", err)
			}
			return
		}
		check.True(t, len(b) <= limit)
		decodeBulkHeader(b)
		DecodeResponse(b)
		req, err := DecodeRequest(b)
		if err != nil {
			check.ErrorIs(t, err, ErrBadRequest)
			return
		}
		frame, err := EncodeFrame(req, 0)
		check.NoError(t, err)
		b2, err := ReadFrame(bytes.NewReader(frame), 0)
		check.NoError(t, err)
		again, err := DecodeRequest(b2)
		check.NoError(t, err)
		check.Equal(t, again, req)
	})
}
