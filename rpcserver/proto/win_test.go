package proto

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"testing"
)

func BenchmarkWindow(b *testing.B) {
	for _, w := range []uint32{256 << 10, 512 << 10, 1 << 20, 2 << 20, 4 << 20, 16 << 20} {
		b.Run(fmt.Sprint(w>>10, "KiB"), func(b *testing.B) {
			streamWindow = w
			const size = 64 << 20
			ts := startServer(b, ServerConfig{Logger: discardLogger()}, func(s *Server) {
				s.HandleBulk("sink", func(ctx context.Context, c *Conn, in Bulk) (Bulk, error) {
					_, err := io.Copy(io.Discard, in.Body)
					return Bulk{}, err
				})
			})
			c := ts.dial(b, DialOptions{Logger: discardLogger()})
			data := make([]byte, size)
			b.SetBytes(size)
			for b.Loop() {
				if err := c.Upload(context.Background(), "sink", "a", size, bytes.NewReader(data)); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
