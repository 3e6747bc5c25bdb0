package proto

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"slices"
	"sync"

	"github.com/vmihailenco/msgpack/v5"
)

// DefaultMaxFrameSize is the largest frame a peer accepts unless configured
// otherwise: 64 MiB. Bulk data does not count: it moves on bulk streams.
const DefaultMaxFrameSize = 64 << 20

// frameHeader is the size of a frame's length prefix.
const frameHeader = 4

// Request is one call on the control stream.
type Request struct {
	// ID is chosen by the caller, unique among its pending calls, never 0.
	ID uint64 `msgpack:"id"`
	// Method names the handler.
	Method string `msgpack:"method"`
	// Args is the msgpack encoding of the arguments (nil encodes as msgpack nil).
	Args msgpack.RawMessage `msgpack:"args"`
	// Deadline is the caller's deadline in Unix nanoseconds; 0 means none.
	Deadline int64 `msgpack:"deadline"`
}

// Response answers the Request with the same ID. Exactly one of Result and
// Error is meaningful: Error non-nil means the call failed. A Response with
// ID 0 answers no request: the listener sends it just before it closes a
// connection it could not read (a malformed or oversized frame), to say why.
type Response struct {
	ID     uint64             `msgpack:"id"`
	Result msgpack.RawMessage `msgpack:"result"`
	Error  *WireError         `msgpack:"error,omitempty"`
}

// BulkHeader opens a bulk stream in each direction: Size raw bytes follow it.
// The dialer's header names the bulk handler (Method) and carries the
// deadline; the listener's header carries Error when the transfer failed.
type BulkHeader struct {
	ID       uint64     `msgpack:"id"`
	Method   string     `msgpack:"method,omitempty"`
	Name     string     `msgpack:"name"`
	Size     int64      `msgpack:"size"`
	Deadline int64      `msgpack:"deadline,omitempty"`
	Error    *WireError `msgpack:"error,omitempty"`
}

// msgpackNil is the encoding of nil, used for absent Args and Result.
var msgpackNil = msgpack.RawMessage{0xc0}

var bufPool = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// EncodeFrame returns v's msgpack encoding behind its uint32 length prefix,
// ready for one Write. It fails with an error wrapping ErrTooLarge when the
// payload exceeds maxSize (DefaultMaxFrameSize when maxSize ≤ 0).
func EncodeFrame(v any, maxSize int) ([]byte, error) {
	if maxSize <= 0 {
		maxSize = DefaultMaxFrameSize
	}
	buf := bufPool.Get().(*bytes.Buffer)
	defer bufPool.Put(buf)
	buf.Reset()
	buf.Write([]byte{0, 0, 0, 0})
	enc := msgpack.GetEncoder()
	enc.Reset(buf)
	err := enc.Encode(v)
	msgpack.PutEncoder(enc)
	if err != nil {
		return nil, fmt.Errorf("encode frame: %w", err)
	}
	n := buf.Len() - frameHeader
	if n > maxSize {
		return nil, fmt.Errorf("encode frame: %d bytes exceed the limit of %d bytes: %w", n, maxSize, ErrTooLarge)
	}
	b := bytes.Clone(buf.Bytes())
	binary.BigEndian.PutUint32(b, uint32(n))
	return b, nil
}

// WriteFrame writes v as one frame to w in a single Write.
func WriteFrame(w io.Writer, v any, maxSize int) error {
	b, err := EncodeFrame(v, maxSize)
	if err != nil {
		return err
	}
	if _, err := w.Write(b); err != nil {
		return fmt.Errorf("write frame: %w", err)
	}
	return nil
}

// ReadFrame reads one frame's payload from r. It returns io.EOF untouched
// when r ends cleanly before a frame, an error wrapping ErrTooLarge when the
// length prefix exceeds maxSize (DefaultMaxFrameSize when maxSize ≤ 0), and
// io.ErrUnexpectedEOF when r ends inside a frame. Memory grows with the
// bytes that actually arrive, not with what the prefix claims.
func ReadFrame(r io.Reader, maxSize int) ([]byte, error) {
	if maxSize <= 0 {
		maxSize = DefaultMaxFrameSize
	}
	var head [frameHeader]byte
	if _, err := io.ReadFull(r, head[:]); err != nil {
		if err == io.EOF {
			return nil, io.EOF
		}
		return nil, fmt.Errorf("read frame: %w", err)
	}
	n := uint64(binary.BigEndian.Uint32(head[:]))
	if n > uint64(maxSize) {
		return nil, fmt.Errorf("read frame: %d bytes exceed the limit of %d bytes: %w", n, maxSize, ErrTooLarge)
	}
	const chunk = 1 << 20
	b := make([]byte, 0, min(int(n), chunk))
	for len(b) < int(n) {
		if len(b) == cap(b) {
			b = slices.Grow(b, min(int(n)-len(b), cap(b)))
		}
		m, err := io.ReadFull(r, b[len(b):min(int(n), cap(b))])
		b = b[:len(b)+m]
		if err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return nil, fmt.Errorf("read frame: %w", err)
		}
	}
	return b, nil
}

// DecodeRequest decodes a frame payload as a Request and checks it: ID is
// not 0, Method is not empty and Args is well-formed msgpack. Failures wrap
// ErrBadRequest.
func DecodeRequest(b []byte) (Request, error) {
	var req Request
	if err := scanMsgpack(b); err != nil {
		return Request{}, fmt.Errorf("decode request: %v: %w", err, ErrBadRequest)
	}
	if err := msgpack.Unmarshal(b, &req); err != nil {
		return Request{}, fmt.Errorf("decode request: %v: %w", err, ErrBadRequest)
	}
	switch {
	case req.ID == 0:
		return Request{}, fmt.Errorf("decode request: id is 0: %w", ErrBadRequest)
	case req.Method == "":
		return Request{}, fmt.Errorf("decode request %d: method is empty: %w", req.ID, ErrBadRequest)
	}
	if len(req.Args) == 0 {
		req.Args = msgpackNil
	}
	return req, nil
}

// DecodeResponse decodes a frame payload as a Response. Failures wrap
// ErrBadRequest.
func DecodeResponse(b []byte) (Response, error) {
	var resp Response
	if err := scanMsgpack(b); err != nil {
		return Response{}, fmt.Errorf("decode response: %v: %w", err, ErrBadRequest)
	}
	if err := msgpack.Unmarshal(b, &resp); err != nil {
		return Response{}, fmt.Errorf("decode response: %v: %w", err, ErrBadRequest)
	}
	if len(resp.Result) == 0 {
		resp.Result = msgpackNil
	}
	return resp, nil
}

// decodeBulkHeader decodes a frame payload as a BulkHeader and checks that
// Size is not negative. Failures wrap ErrBadRequest.
func decodeBulkHeader(b []byte) (BulkHeader, error) {
	var h BulkHeader
	if err := scanMsgpack(b); err != nil {
		return BulkHeader{}, fmt.Errorf("decode bulk header: %v: %w", err, ErrBadRequest)
	}
	if err := msgpack.Unmarshal(b, &h); err != nil {
		return BulkHeader{}, fmt.Errorf("decode bulk header: %v: %w", err, ErrBadRequest)
	}
	if h.Size < 0 {
		return BulkHeader{}, fmt.Errorf("decode bulk header %d: size %d is negative: %w", h.ID, h.Size, ErrBadRequest)
	}
	return h, nil
}

// marshal encodes v, mapping nil to msgpack nil; a msgpack.RawMessage is
// taken as already encoded.
func marshal(v any) (msgpack.RawMessage, error) {
	switch v := v.(type) {
	case nil:
		return msgpackNil, nil
	case msgpack.RawMessage:
		if len(v) == 0 {
			return msgpackNil, nil
		}
		return v, nil
	}
	b, err := msgpack.Marshal(v)
	if err != nil {
		return nil, err
	}
	return b, nil
}
