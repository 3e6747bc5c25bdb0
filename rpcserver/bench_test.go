package rpcserver_test

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/kiln-ml/kiln/client"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/rpcserver"
	"github.com/kiln-ml/kiln/rpcserver/proto"
)

// BenchmarkRPCCall is the round trip of an empty remote function on
// loopback: client → daemon → worker → back. Besides ns/op (the mean) it
// reports the median and the 99th percentile of single calls.
func BenchmarkRPCCall(b *testing.B) {
	td := startDaemon(b, rpcserver.Config{})
	s := td.connect(b, client.SessionOptions{})
	ctx := context.Background()
	nop, err := s.GetGlobal(ctx, rpcserver.GlobalNop)
	check.NoError(b, err)
	for range 100 { // warm up connections and buffers
		_, err := nop.Call(ctx)
		check.NoError(b, err)
	}
	lat := make([]time.Duration, 0, 1<<16)
	for b.Loop() {
		start := time.Now()
		if _, err := nop.Call(ctx); err != nil {
			b.Fatal(err)
		}
		if len(lat) < cap(lat) {
			lat = append(lat, time.Since(start))
		}
	}
	slices.Sort(lat)
	if n := len(lat); n > 0 {
		b.ReportMetric(float64(lat[n/2].Nanoseconds())/1e3, "median-µs")
		b.ReportMetric(float64(lat[min(n-1, n*99/100)].Nanoseconds())/1e3, "p99-µs")
	}
}

// BenchmarkUpload64MiB uploads a 64 MiB file to a session on loopback;
// MB/s is the throughput.
func BenchmarkUpload64MiB(b *testing.B) {
	td := startDaemon(b, rpcserver.Config{})
	s := td.connect(b, client.SessionOptions{})
	ctx := context.Background()
	data := make([]byte, 64<<20)
	for i := range data {
		data[i] = byte(i * 7)
	}
	b.SetBytes(int64(len(data)))
	for b.Loop() {
		if err := s.Upload(ctx, "artifact.kiln", data); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkWorkerCall is the worker hop alone: an in-process worker served
// over a socket pair, called directly (no daemon), for comparison with
// BenchmarkRPCCall.
func BenchmarkWorkerCall(b *testing.B) {
	dir := b.TempDir()
	check.NoError(b, os.Mkdir(filepath.Join(dir, "files"), 0o700))
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM, 0)
	check.NoError(b, err)
	conns := make([]net.Conn, 2)
	for i, fd := range fds {
		f := os.NewFile(uintptr(fd), "pair")
		conns[i], err = net.FileConn(f)
		f.Close()
		check.NoError(b, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- rpcserver.RunWorker(ctx, conns[0], rpcserver.WorkerConfig{Dir: dir}) }()
	defer func() { cancel(); <-done }()
	c, err := proto.NewClient(ctx, conns[1], proto.DialOptions{Role: proto.RoleWorker, KeepAlive: -1})
	check.NoError(b, err)
	defer c.Close()
	var fi proto.FuncInfo
	check.NoError(b, c.Call(ctx, proto.GlobalGet, proto.GetFunctionArgs{Name: rpcserver.GlobalNop}, &fi))
	args := proto.CallArgs{Func: fi.Handle}
	for b.Loop() {
		if err := c.Call(ctx, proto.FuncCall, args, nil); err != nil {
			b.Fatal(err)
		}
	}
}
