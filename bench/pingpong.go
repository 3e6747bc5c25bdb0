package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"slices"
	"strings"
	"time"
)

// pingPongEnv makes this binary an echo server for the rpc-call
// benchmark's floor: it listens on loopback, prints its address, and
// echoes every byte back until its client leaves.
const pingPongEnv = "KILN_BENCH_PINGPONG"

func init() {
	if os.Getenv(pingPongEnv) == "1" {
		os.Exit(servePingPong())
	}
}

func servePingPong() int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println(ln.Addr())
	c, err := ln.Accept()
	if err != nil {
		return 1
	}
	c.(*net.TCPConn).SetNoDelay(true)
	var b [1]byte
	for {
		if _, err := io.ReadFull(c, b[:]); err != nil {
			return 0
		}
		if _, err := c.Write(b[:]); err != nil {
			return 0
		}
	}
}

// pingPong times n one-byte round trips over TCP on loopback between this
// process and a subprocess of this binary: the floor under a remote call,
// two processes and the kernel's loopback, with no protocol at all. It
// returns the round trips in µs, sorted.
func pingPong(ctx context.Context, n int) ([]float64, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("ping-pong: %w", err)
	}
	cmd := exec.CommandContext(ctx, exe)
	cmd.Env = append(os.Environ(), pingPongEnv+"=1",
		"GORACE="+strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("ping-pong: %w", err)
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("ping-pong: %w", err)
	}
	defer cmd.Wait()
	defer cmd.Process.Kill()
	addr, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		return nil, fmt.Errorf("ping-pong: the echo server said nothing: %w", err)
	}
	c, err := net.Dial("tcp", strings.TrimSpace(addr))
	if err != nil {
		return nil, fmt.Errorf("ping-pong: %w", err)
	}
	defer c.Close()
	c.(*net.TCPConn).SetNoDelay(true)
	lat := make([]float64, n)
	var b [1]byte
	for i := range lat {
		start := time.Now()
		if _, err := c.Write(b[:]); err != nil {
			return nil, fmt.Errorf("ping-pong: %w", err)
		}
		if _, err := io.ReadFull(c, b[:]); err != nil {
			return nil, fmt.Errorf("ping-pong: %w", err)
		}
		lat[i] = float64(time.Since(start).Nanoseconds()) / 1e3
	}
	slices.Sort(lat)
	return lat, nil
}
