package proto

import (
	"bytes"
	"context"
	"io"
	"net"
	"testing"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/kiln-ml/kiln/internal/check"
)

func TestDialRefused(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	check.NoError(t, err)
	addr := ln.Addr().String()
	ln.Close()
	ctx, cancel := context.WithTimeout(context.Background(), guard)
	defer cancel()
	_, err = Dial(ctx, addr, DialOptions{})
	check.ErrorIs(t, err, ErrUnavailable)
	check.Error(t, err, "dial "+addr)
}

func TestClientClose(t *testing.T) {
	ts := startServer(t, ServerConfig{}, basicHandlers)
	c := ts.dial(t, DialOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), guard)
	defer cancel()
	check.True(t, c.Err() == nil)
	check.Equal(t, c.RemoteAddr(), ts.addr)
	check.NoError(t, c.Close())
	<-c.Done()
	check.Error(t, c.Err(), "closed by this client")
	err := c.Call(ctx, "empty", nil, nil)
	check.ErrorIs(t, err, ErrUnavailable)
	check.NoError(t, c.Close())
}

// BenchmarkCallRoundTrip measures one call of an empty method on loopback.
func BenchmarkCallRoundTrip(b *testing.B) {
	ts := startServer(b, ServerConfig{}, basicHandlers)
	c := ts.dial(b, DialOptions{})
	ctx := context.Background()
	for b.Loop() {
		if err := c.Call(ctx, "empty", nil, nil); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCallParallel measures calls of an empty method from many
// goroutines sharing one connection.
func BenchmarkCallParallel(b *testing.B) {
	ts := startServer(b, ServerConfig{}, basicHandlers)
	c := ts.dial(b, DialOptions{})
	ctx := context.Background()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := c.Call(ctx, "empty", nil, nil); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchmarkBulk measures a 64 MiB upload on loopback (MB/s is the figure).
func BenchmarkBulk(b *testing.B) {
	const size = 64 << 20
	ts := startServer(b, ServerConfig{}, func(s *Server) {
		s.HandleBulk("sink", func(ctx context.Context, c *Conn, in Bulk) (Bulk, error) {
			_, err := io.Copy(io.Discard, in.Body)
			return Bulk{}, err
		})
	})
	c := ts.dial(b, DialOptions{})
	data := make([]byte, size)
	ctx := context.Background()
	b.SetBytes(size)
	for b.Loop() {
		if err := c.Upload(ctx, "sink", "artifact.kiln", size, bytes.NewReader(data)); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCallArgs measures a call carrying a small struct both ways.
func BenchmarkCallArgs(b *testing.B) {
	ts := startServer(b, ServerConfig{}, basicHandlers)
	c := ts.dial(b, DialOptions{})
	ctx := context.Background()
	var sum int
	for b.Loop() {
		if err := c.Call(ctx, "add", addArgs{A: 1, B: 2}, &sum); err != nil {
			b.Fatal(err)
		}
	}
	_ = msgpack.RawMessage(nil)
}
