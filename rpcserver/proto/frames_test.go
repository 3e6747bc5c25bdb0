package proto

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"testing"

	"github.com/kiln-ml/kiln/internal/check"
)

// startFrames serves one end of a pipe with ServeFrames and returns a
// NewFrameClient on the other, the cancel that stops the server and the
// channel ServeFrames' result arrives on.
func startFrames(t *testing.T) (*Client, context.CancelFunc, chan error) {
	t.Helper()
	srv := NewServer(ServerConfig{Logger: newLogSink(t).logger()})
	basicHandlers(srv)
	a, b := net.Pipe()
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- srv.ServeFrames(ctx, a) }()
	dctx, dcancel := context.WithTimeout(context.Background(), guard)
	defer dcancel()
	c, err := NewFrameClient(dctx, b, DialOptions{Role: RoleWorker, Logger: newLogSink(t).logger()})
	check.NoError(t, err)
	t.Cleanup(func() { cancel(); c.Close() })
	return c, cancel, served
}

func TestServeFrames(t *testing.T) {
	c, cancel, served := startFrames(t)
	ctx, done := context.WithTimeout(context.Background(), guard)
	defer done()
	tests := []struct {
		name   string
		method string
		args   any
		want   string // fmt.Sprint of the result
		is     error
	}{
		{name: "add", method: "add", args: addArgs{A: 2, B: 3}, want: "5"},
		{name: "role", method: "role", want: "worker"},
		{name: "empty", method: "empty", want: "<nil>"},
		{name: "unknown method", method: "nope", is: ErrNotFound},
		{name: "bad args", method: "add", args: "x", is: ErrBadRequest},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got any
			err := c.Call(ctx, tt.method, tt.args, &got)
			if tt.is != nil {
				check.ErrorIs(t, err, tt.is)
				return
			}
			check.NoError(t, err)
			check.Equal(t, fmt.Sprint(got), tt.want)
		})
	}
	t.Run("no bulk", func(t *testing.T) {
		_, err := c.Bulk(ctx, "up", Bulk{Name: "x"}, nil)
		check.ErrorIs(t, err, ErrBadRequest)
	})
	t.Run("server stops", func(t *testing.T) {
		cancel()
		check.NoError(t, <-served)
		<-c.Done()
		check.ErrorIs(t, c.Call(ctx, "empty", nil, nil), ErrUnavailable)
	})
}

// writeCounter records each Write it gets.
type writeCounter struct {
	net.Conn
	writes [][]byte
}

func (w *writeCounter) Write(p []byte) (int, error) {
	w.writes = append(w.writes, bytes.Clone(p))
	return len(p), nil
}

// yamuxHeader builds a yamux frame header.
func yamuxHeader(typ byte, id, length uint32) []byte {
	h := make([]byte, yamuxHeaderSize)
	h[1] = typ
	binary.BigEndian.PutUint32(h[4:], id)
	binary.BigEndian.PutUint32(h[8:], length)
	return h
}

func TestCoalescedConn(t *testing.T) {
	big := bytes.Repeat([]byte{7}, coalesceMax+1)
	tests := []struct {
		name   string
		writes [][]byte
		want   int // writes that reach the connection
	}{
		{name: "data header and body", writes: [][]byte{yamuxHeader(0, 1, 3), []byte("abc")}, want: 1},
		{name: "large body passes", writes: [][]byte{yamuxHeader(0, 1, uint32(len(big))), big}, want: 2},
		{name: "window update passes", writes: [][]byte{yamuxHeader(1, 1, 0), yamuxHeader(0, 1, 2), []byte("hi")}, want: 2},
		{name: "empty data frame passes", writes: [][]byte{yamuxHeader(0, 1, 0), yamuxHeader(2, 0, 0)}, want: 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			wc := &writeCounter{}
			c := coalesce(wc)
			var want []byte
			for _, p := range tt.writes {
				n, err := c.Write(p)
				check.NoError(t, err)
				check.Equal(t, n, len(p))
				want = append(want, p...)
			}
			check.Equal(t, len(wc.writes), tt.want, "writes")
			check.True(t, bytes.Equal(bytes.Join(wc.writes, nil), want), "bytes on the wire differ")
		})
	}
}
