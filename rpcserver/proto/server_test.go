package proto

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/kiln-ml/kiln/internal/check"
)

type addArgs struct {
	A, B int
}

// basicHandlers registers the handlers most tests use.
func basicHandlers(s *Server) {
	s.Handle("add", func(ctx context.Context, c *Conn, args msgpack.RawMessage) (any, error) {
		var a addArgs
		if err := msgpack.Unmarshal(args, &a); err != nil {
			return nil, fmt.Errorf("decode args: %v: %w", err, ErrBadRequest)
		}
		return a.A + a.B, nil
	})
	s.Handle("empty", func(ctx context.Context, c *Conn, args msgpack.RawMessage) (any, error) {
		return nil, nil
	})
	s.Handle("role", func(ctx context.Context, c *Conn, args msgpack.RawMessage) (any, error) {
		return c.Role().String(), nil
	})
}

func TestRoundTrip(t *testing.T) {
	ts := startServer(t, ServerConfig{Token: "s3cret"}, basicHandlers)
	c := ts.dial(t, DialOptions{Token: "s3cret", Role: RoleCompiler})
	ctx, cancel := context.WithTimeout(context.Background(), guard)
	defer cancel()

	var sum int
	check.NoError(t, c.Call(ctx, "add", addArgs{A: 2, B: 40}, &sum))
	check.Equal(t, sum, 42)

	var role string
	check.NoError(t, c.Call(ctx, "role", nil, &role))
	check.Equal(t, role, "compiler")

	var raw msgpack.RawMessage
	check.NoError(t, c.Call(ctx, "empty", nil, &raw))
	check.Equal(t, raw, msgpackNil)
	check.NoError(t, c.Call(ctx, "empty", nil, nil))

	err := c.Call(ctx, "nope", nil, nil)
	check.ErrorIs(t, err, ErrNotFound)
	check.Error(t, err, `call "nope"`, `unknown method "nope"`)

	err = c.Call(ctx, "add", "not a struct", &sum)
	check.ErrorIs(t, err, ErrBadRequest)
	check.Error(t, err, "decode args")

	// A result that does not fit the caller's type.
	var wrong struct{ X []string }
	check.ErrorIs(t, c.Call(ctx, "add", addArgs{}, &wrong), ErrBadRequest)
}

func TestConcurrentCalls(t *testing.T) {
	const n = 50
	var arrived atomic.Int32
	all := make(chan struct{})
	ts := startServer(t, ServerConfig{}, func(s *Server) {
		// Every call waits for all n to arrive: this only finishes when the
		// server runs the requests of one connection concurrently.
		s.Handle("barrier", func(ctx context.Context, c *Conn, args msgpack.RawMessage) (any, error) {
			var i int
			if err := msgpack.Unmarshal(args, &i); err != nil {
				return nil, err
			}
			if arrived.Add(1) == n {
				close(all)
			}
			select {
			case <-all:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			return i * 2, nil
		})
	})
	c := ts.dial(t, DialOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), guard)
	defer cancel()

	var wg sync.WaitGroup
	errs := make([]error, n)
	got := make([]int, n)
	for i := range n {
		wg.Go(func() { errs[i] = c.Call(ctx, "barrier", i, &got[i]) })
	}
	wg.Wait()
	for i := range n {
		check.NoError(t, errs[i], "call", i)
		check.Equal(t, got[i], 2*i, "call", i)
	}
}

func TestErrorsAcrossTheWire(t *testing.T) {
	ts := startServer(t, ServerConfig{}, func(s *Server) {
		s.Handle("fail", func(ctx context.Context, c *Conn, args msgpack.RawMessage) (any, error) {
			var code Code
			if err := msgpack.Unmarshal(args, &code); err != nil {
				return nil, err
			}
			return nil, fmt.Errorf("load module %q: %w", "m.kiln", code.Sentinel())
		})
		s.Handle("plain", func(ctx context.Context, c *Conn, args msgpack.RawMessage) (any, error) {
			return nil, errors.New("disk on fire")
		})
		s.Handle("ctxdeadline", func(ctx context.Context, c *Conn, args msgpack.RawMessage) (any, error) {
			return nil, fmt.Errorf("wait: %w", context.DeadlineExceeded)
		})
		s.Handle("panic", func(ctx context.Context, c *Conn, args msgpack.RawMessage) (any, error) {
			panic("index out of range")
		})
	})
	c := ts.dial(t, DialOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), guard)
	defer cancel()

	for _, tc := range codes {
		t.Run(string(tc.code), func(t *testing.T) {
			err := c.Call(ctx, "fail", tc.code, nil)
			check.ErrorIs(t, err, tc.err)
			check.Error(t, err, `call "fail": load module "m.kiln": `+tc.err.Error())
			var we *WireError
			check.True(t, errors.As(err, &we), "a *WireError in the chain")
			check.Equal(t, we.Code, tc.code)
			for _, other := range codes {
				if other.code != tc.code {
					check.True(t, !errors.Is(err, other.err), "also", other.code)
				}
			}
		})
	}
	t.Run("unknown error is internal", func(t *testing.T) {
		err := c.Call(ctx, "plain", nil, nil)
		check.ErrorIs(t, err, ErrInternal)
		check.Error(t, err, "disk on fire")
	})
	t.Run("context deadline is deadline", func(t *testing.T) {
		check.ErrorIs(t, c.Call(ctx, "ctxdeadline", nil, nil), ErrDeadline)
	})
	t.Run("panic is internal", func(t *testing.T) {
		err := c.Call(ctx, "panic", nil, nil)
		check.ErrorIs(t, err, ErrInternal)
		check.Error(t, err, `handler "panic" panicked: index out of range`)
		// The connection survives the panic.
		check.ErrorIs(t, c.Call(ctx, "fail", CodeBusy, nil), ErrBusy)
	})
}

func TestWrongToken(t *testing.T) {
	var calls atomic.Int32
	ts := startServer(t, ServerConfig{Token: "right"}, func(s *Server) {
		s.refused.Interval = 2 * time.Second
		s.Handle("empty", func(ctx context.Context, c *Conn, args msgpack.RawMessage) (any, error) {
			calls.Add(1)
			return nil, nil
		})
	})
	ctx, cancel := context.WithTimeout(context.Background(), guard)
	defer cancel()
	for _, tok := range []string{"wrong", "", "right-but-longer", strings.Repeat("x", MaxTokenSize)} {
		c, err := Dial(ctx, ts.addr, DialOptions{Token: tok})
		check.True(t, c == nil, "no client")
		check.ErrorIs(t, err, ErrUnauthorized)
		if tok == "" {
			check.Error(t, err, "authentication failed: no token was given and the server requires one")
		} else {
			check.Error(t, err, "authentication failed: wrong token")
		}
	}
	check.Equal(t, calls.Load(), int32(0))
	// The server's log says the interval's first refusal, then how many
	// more. Which refusal comes first is the server's: it replies before
	// it logs, so the next dial's refusal may be noted before this one's.
	for _, want := range []string{`msg="hello refused" err="authentication failed: `, `msg="hello refused (summary)" refused=3 peers=1`} {
		deadline := time.Now().Add(guard)
		for !ts.logs.contains(want) && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		check.True(t, ts.logs.contains(want), "logged "+want)
	}

	// Nothing is served after a refused hello, even to a peer that goes on.
	nc, err := net.Dial("tcp", ts.addr)
	check.NoError(t, err)
	defer nc.Close()
	nc.SetDeadline(time.Now().Add(guard))
	check.NoError(t, WriteHello(nc, Hello{Version: ProtocolVersion, Role: RoleClient, Token: "wrong"}))
	rep, err := ReadHelloReply(nc)
	check.NoError(t, err)
	check.Equal(t, rep.Status, StatusBadToken)
	nc.Write([]byte("anything at all"))
	_, err = io.ReadAll(nc)
	check.True(t, !isTimeout(err), "connection closed, not left open", err)
	check.Equal(t, calls.Load(), int32(0))

	c := ts.dial(t, DialOptions{Token: "right"})
	check.NoError(t, c.Call(ctx, "empty", nil, nil))
	check.Equal(t, calls.Load(), int32(1))
}

func TestRoles(t *testing.T) {
	ts := startServer(t, ServerConfig{Roles: []Role{RoleDevice, RoleCompiler}}, basicHandlers)
	ctx, cancel := context.WithTimeout(context.Background(), guard)
	defer cancel()
	_, err := Dial(ctx, ts.addr, DialOptions{Role: RoleClient})
	check.ErrorIs(t, err, ErrBadRequest)
	check.Error(t, err, "does not serve role client")
	_, err = Dial(ctx, ts.addr, DialOptions{Role: Role(99)})
	check.ErrorIs(t, err, ErrBadRequest)
	check.Error(t, err, "role(99)")
	c := ts.dial(t, DialOptions{Role: RoleDevice})
	var role string
	check.NoError(t, c.Call(ctx, "role", nil, &role))
	check.Equal(t, role, "device")
}

// TestListenerKind: a listener names its kind in the hello reply, and a
// dialer that expected another kind is refused, naming both; one that
// expects nothing, or the kind it reaches, connects.
func TestListenerKind(t *testing.T) {
	ts := startServer(t, ServerConfig{Kind: ListenerDevice}, basicHandlers)
	ctx, cancel := context.WithTimeout(context.Background(), guard)
	defer cancel()
	_, err := Dial(ctx, ts.addr, DialOptions{Expect: ListenerTracker})
	check.ErrorIs(t, err, ErrBadRequest)
	var pk *PeerKindError
	check.True(t, errors.As(err, &pk), "want a *PeerKindError, got", err)
	check.Equal(t, err.Error(), ts.addr+" is a kiln device daemon (kiln rpcserver), not a kiln tracker: pass the address of a kiln tracker")
	ts.dial(t, DialOptions{Expect: ListenerDevice})
	ts.dial(t, DialOptions{})

	// A listener that names no kind (an older one) is taken for what the
	// dialer expects.
	anon := startServer(t, ServerConfig{}, basicHandlers)
	anon.dial(t, DialOptions{Expect: ListenerTracker})
}

func TestWrongVersion(t *testing.T) {
	ts := startServer(t, ServerConfig{Token: "t"}, basicHandlers)

	t.Run("dialer speaks 3", func(t *testing.T) {
		nc, err := net.Dial("tcp", ts.addr)
		check.NoError(t, err)
		defer nc.Close()
		nc.SetDeadline(time.Now().Add(guard))
		// A hand-made hello of version 3, whose layout after the version is
		// unknown to this kiln.
		hello := []byte("KILN\x00\x03\x01\x00\x01t-and-more-bytes-of-version-3")
		_, err = nc.Write(hello)
		check.NoError(t, err)
		rep, err := ReadHelloReply(nc)
		check.NoError(t, err)
		check.Equal(t, rep.Status, StatusBadVersion)
		check.Equal(t, rep.Version, ProtocolVersion)
		check.True(t, strings.Contains(rep.Message, "protocol version mismatch: peer speaks 3, this kiln speaks 1"), rep.Message)
	})

	t.Run("listener speaks 2", func(t *testing.T) {
		// A fake listener of version 2 reads the hello and refuses it.
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		check.NoError(t, err)
		defer ln.Close()
		served := make(chan error, 1)
		go func() {
			nc, err := ln.Accept()
			if err != nil {
				served <- err
				return
			}
			defer nc.Close()
			if _, err := ReadHello(nc); err != nil {
				served <- err
				return
			}
			served <- WriteHelloReply(nc, HelloReply{Version: 2, Status: StatusBadVersion, Message: "upgrade"})
		}()
		ctx, cancel := context.WithTimeout(context.Background(), guard)
		defer cancel()
		_, err = Dial(ctx, ln.Addr().String(), DialOptions{})
		check.ErrorIs(t, err, ErrVersion)
		check.Error(t, err, "protocol version mismatch: peer speaks 2, this kiln speaks 1")
		check.NoError(t, <-served)
	})
}

func TestNotKiln(t *testing.T) {
	ts := startServer(t, ServerConfig{}, basicHandlers)
	nc, err := net.Dial("tcp", ts.addr)
	check.NoError(t, err)
	defer nc.Close()
	nc.SetDeadline(time.Now().Add(guard))
	_, err = nc.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"))
	check.NoError(t, err)
	b, err := io.ReadAll(nc)
	check.True(t, !isTimeout(err), "the server dropped the connection", err)
	check.Equal(t, len(b), 0, "no reply to a peer that is not kiln")
	// Serving the connection has ended by the time the server closed it,
	// and it logs before closing.
	check.True(t, ts.logs.contains("does not speak kiln"), "logged")
	check.True(t, ts.logs.contains(`first bytes are \"GET \", not \"KILN\"`), "logged the bytes")

	// A Client pointed at something that is not kiln says so.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	check.NoError(t, err)
	defer ln.Close()
	go func() {
		nc, err := ln.Accept()
		if err != nil {
			return
		}
		defer nc.Close()
		nc.Write([]byte("SSH-2.0-OpenSSH_9.6\r\n"))
		io.Copy(io.Discard, nc)
	}()
	ctx, cancel := context.WithTimeout(context.Background(), guard)
	defer cancel()
	_, err = Dial(ctx, ln.Addr().String(), DialOptions{})
	check.ErrorIs(t, err, ErrBadRequest)
	check.Error(t, err, "not a kiln daemon")

	c := ts.dial(t, DialOptions{})
	check.NoError(t, c.Call(ctx, "empty", nil, nil))
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func TestHandshakeDeadline(t *testing.T) {
	ts := startServer(t, ServerConfig{HandshakeTimeout: 50 * time.Millisecond}, basicHandlers)
	for _, partial := range []string{"", "KI", "KILN\x00\x01\x01\x00\x10only-part"} {
		nc, err := net.Dial("tcp", ts.addr)
		check.NoError(t, err)
		nc.SetDeadline(time.Now().Add(guard))
		_, err = nc.Write([]byte(partial))
		check.NoError(t, err)
		// The server gives up on the silent peer and closes the connection.
		_, err = io.ReadAll(nc)
		check.True(t, !isTimeout(err), "the server dropped the connection", partial, err)
		nc.Close()
	}
	check.True(t, ts.logs.contains("handshake failed"), "logged")

	// A dialer's own handshake deadline: a listener that never answers.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	check.NoError(t, err)
	defer ln.Close()
	go func() {
		nc, err := ln.Accept()
		if err != nil {
			return
		}
		defer nc.Close()
		io.Copy(io.Discard, nc)
	}()
	ctx, cancel := context.WithTimeout(context.Background(), guard)
	defer cancel()
	_, err = Dial(ctx, ln.Addr().String(), DialOptions{HandshakeTimeout: 50 * time.Millisecond})
	check.ErrorIs(t, err, ErrUnavailable)
	check.Error(t, err, "timeout")

	// The server still serves.
	c := ts.dial(t, DialOptions{})
	check.NoError(t, c.Call(ctx, "empty", nil, nil))
}

func TestBadFrames(t *testing.T) {
	ts := startServer(t, ServerConfig{}, basicHandlers)
	ctx, cancel := context.WithTimeout(context.Background(), guard)
	defer cancel()
	// A well-behaved client on the same server, before and after.
	good := ts.dial(t, DialOptions{})
	check.NoError(t, good.Call(ctx, "empty", nil, nil))

	cases := []struct {
		name  string
		bytes []byte
		want  []string
		code  Code
	}{
		{"oversized", binary.BigEndian.AppendUint32(nil, DefaultMaxFrameSize+1), []string{"67108865 bytes exceed the limit of 67108864 bytes"}, CodeTooLarge},
		{"huge", []byte{0xff, 0xff, 0xff, 0xff}, []string{"exceed the limit"}, CodeTooLarge},
		{"garbage", append(binary.BigEndian.AppendUint32(nil, 5), 0xc1, 0xc1, 0xc1, 0xc1, 0xc1), []string{"decode request"}, CodeBadRequest},
		{"not a map", append(binary.BigEndian.AppendUint32(nil, 3), 0x93, 0x01, 0x02, 0x03), []string{"decode request"}, CodeBadRequest},
		{"id zero", mustFrame(t, Request{Method: "empty"}), []string{"id is 0"}, CodeBadRequest},
		{"no method", mustFrame(t, Request{ID: 7}), []string{"method is empty"}, CodeBadRequest},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			sess, st := rawSession(t, ts.addr, "")
			// The write may report the session's end: yamux races the
			// confirmation of a sent frame with the server's quick close.
			st.Write(tc.bytes)
			// The server says why, then closes this connection.
			b, err := ReadFrame(st, 0)
			check.NoError(t, err)
			resp, err := DecodeResponse(b)
			check.NoError(t, err)
			check.Equal(t, resp.ID, uint64(0))
			check.True(t, resp.Error != nil, "an error")
			check.Equal(t, resp.Error.Code, tc.code)
			for _, w := range tc.want {
				check.True(t, strings.Contains(resp.Error.Message, w), resp.Error.Message)
			}
			waitClosed(t, sess)
			check.NoError(t, good.Call(ctx, "empty", nil, nil), "other clients are still served")
		})
	}

	t.Run("client sees the reason", func(t *testing.T) {
		// A client whose frame limit is larger than its server's: the
		// server closes the connection and the client's call says why.
		small := startServer(t, ServerConfig{MaxFrameSize: 1024}, basicHandlers)
		c := small.dial(t, DialOptions{})
		err := c.Call(ctx, "empty", make([]byte, 4096), nil)
		check.ErrorIs(t, err, ErrUnavailable)
		<-c.Done()
		check.ErrorIs(t, c.Err(), ErrUnavailable)
		check.Error(t, c.Err(), "closed by the peer", "exceed the limit of 1024 bytes")
		check.NoError(t, good.Call(ctx, "empty", nil, nil))
	})

	t.Run("client refuses to send an oversized frame", func(t *testing.T) {
		c := ts.dial(t, DialOptions{MaxFrameSize: 1024})
		err := c.Call(ctx, "empty", make([]byte, 2048), nil)
		check.ErrorIs(t, err, ErrTooLarge)
		check.NoError(t, c.Call(ctx, "empty", nil, nil), "the connection is intact")
	})
}

func mustFrame(t testing.TB, v any) []byte {
	t.Helper()
	b, err := EncodeFrame(v, 0)
	check.NoError(t, err)
	return b
}

func TestDeadlinePassed(t *testing.T) {
	var ran atomic.Int32
	ts := startServer(t, ServerConfig{}, func(s *Server) {
		s.Handle("count", func(ctx context.Context, c *Conn, args msgpack.RawMessage) (any, error) {
			ran.Add(1)
			return nil, nil
		})
		s.Handle("wait", func(ctx context.Context, c *Conn, args msgpack.RawMessage) (any, error) {
			<-ctx.Done()
			return nil, ctx.Err()
		})
	})

	// A request whose deadline passed before it arrived is answered with
	// ErrDeadline and never runs.
	_, st := rawSession(t, ts.addr, "")
	check.NoError(t, WriteFrame(st, Request{ID: 1, Method: "count", Deadline: time.Now().Add(-time.Second).UnixNano()}, 0))
	check.NoError(t, WriteFrame(st, Request{ID: 2, Method: "count"}, 0))
	seen := map[uint64]*WireError{}
	for range 2 {
		b, err := ReadFrame(st, 0)
		check.NoError(t, err)
		resp, err := DecodeResponse(b)
		check.NoError(t, err)
		seen[resp.ID] = resp.Error
	}
	check.True(t, seen[1] != nil, "request 1 failed")
	check.ErrorIs(t, seen[1], ErrDeadline)
	check.Error(t, seen[1], `request 1 ("count"): deadline passed before it ran`)
	check.True(t, seen[2] == nil, "request 2 succeeded")
	check.Equal(t, ran.Load(), int32(1))

	c := ts.dial(t, DialOptions{})
	// The client does not send a call whose context has already ended.
	past, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel()
	err := c.Call(past, "count", nil, nil)
	check.ErrorIs(t, err, ErrDeadline)
	check.ErrorIs(t, err, context.DeadlineExceeded)
	check.Equal(t, ran.Load(), int32(1))

	// The deadline travels: the handler's context ends with the caller's.
	short, cancel2 := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel2()
	check.ErrorIs(t, c.Call(short, "wait", nil, nil), ErrDeadline)

	cancelled, cancel3 := context.WithCancel(context.Background())
	cancel3()
	check.ErrorIs(t, c.Call(cancelled, "count", nil, nil), ErrCancelled)
}

func TestBulk(t *testing.T) {
	const size = 8 << 20
	data := make([]byte, size)
	rand.Read(data)
	want := sha256.Sum256(data)
	uploaded := make(chan [32]byte, 1)

	ts := startServer(t, ServerConfig{MaxBulkSize: 16 << 20}, func(s *Server) {
		s.HandleBulk("echo", func(ctx context.Context, c *Conn, in Bulk) (Bulk, error) {
			b, err := io.ReadAll(in.Body)
			if err != nil {
				return Bulk{}, err
			}
			return Bulk{Name: in.Name + ".back", Size: int64(len(b)), Body: bytes.NewReader(b)}, nil
		})
		s.HandleBulk("upload", func(ctx context.Context, c *Conn, in Bulk) (Bulk, error) {
			if strings.Contains(in.Name, "..") {
				// Refused before reading a byte of the body.
				return Bulk{}, fmt.Errorf("upload %q: name leaves the session directory: %w", in.Name, ErrBadRequest)
			}
			h := sha256.New()
			if _, err := io.Copy(h, in.Body); err != nil {
				return Bulk{}, err
			}
			var sum [32]byte
			h.Sum(sum[:0])
			uploaded <- sum
			return Bulk{}, nil
		})
		s.HandleBulk("download", func(ctx context.Context, c *Conn, in Bulk) (Bulk, error) {
			return Bulk{Size: size, Body: bytes.NewReader(data)}, nil
		})
		s.HandleBulk("partial", func(ctx context.Context, c *Conn, in Bulk) (Bulk, error) {
			// Reads only part of the upload: the rest is discarded.
			io.ReadFull(in.Body, make([]byte, 10))
			return Bulk{}, nil
		})
	})
	c := ts.dial(t, DialOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), guard)
	defer cancel()

	t.Run("upload", func(t *testing.T) {
		check.NoError(t, c.Upload(ctx, "upload", "model.kiln", size, bytes.NewReader(data)))
		check.Equal(t, <-uploaded, want)
	})
	t.Run("download", func(t *testing.T) {
		h := sha256.New()
		n, err := c.Download(ctx, "download", "t0", h)
		check.NoError(t, err)
		check.Equal(t, n, int64(size))
		check.Equal(t, [32]byte(h.Sum(nil)), want)
	})
	t.Run("echo", func(t *testing.T) {
		var got bytes.Buffer
		n, err := c.Bulk(ctx, "echo", Bulk{Name: "x", Size: size, Body: bytes.NewReader(data)}, &got)
		check.NoError(t, err)
		check.Equal(t, n, int64(size))
		check.Equal(t, sha256.Sum256(got.Bytes()), want)
	})
	t.Run("concurrent with calls", func(t *testing.T) {
		ts.Handle("empty", func(ctx context.Context, c *Conn, args msgpack.RawMessage) (any, error) { return nil, nil })
		var wg sync.WaitGroup
		wg.Go(func() {
			check.NoError(t, c.Upload(ctx, "upload", "a", size, bytes.NewReader(data)))
			check.Equal(t, <-uploaded, want)
		})
		for range 20 {
			check.NoError(t, c.Call(ctx, "empty", nil, nil))
		}
		wg.Wait()
	})
	t.Run("refused early", func(t *testing.T) {
		err := c.Upload(ctx, "upload", "../x", size, bytes.NewReader(data))
		check.ErrorIs(t, err, ErrBadRequest)
		check.Error(t, err, `upload "../x": name leaves the session directory`)
	})
	t.Run("unknown method", func(t *testing.T) {
		err := c.Upload(ctx, "nope", "x", size, bytes.NewReader(data))
		check.ErrorIs(t, err, ErrNotFound)
		check.Error(t, err, `unknown bulk method "nope"`)
	})
	t.Run("too large", func(t *testing.T) {
		err := c.Upload(ctx, "upload", "x", 1<<40, zeros{})
		check.ErrorIs(t, err, ErrTooLarge)
		check.Error(t, err, "exceeds the limit of 16777216 bytes")
	})
	t.Run("partly read", func(t *testing.T) {
		check.NoError(t, c.Upload(ctx, "partial", "x", size, bytes.NewReader(data)))
	})
	t.Run("short body", func(t *testing.T) {
		err := c.Upload(ctx, "upload", "x", size, bytes.NewReader(data[:100]))
		check.Error(t, err, "send body", "unexpected EOF")
	})
	t.Run("deadline passed", func(t *testing.T) {
		past, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
		defer cancel()
		check.ErrorIs(t, c.Upload(past, "upload", "x", size, bytes.NewReader(data)), ErrDeadline)
	})
	// The connection is still good for calls.
	check.NoError(t, c.Call(ctx, "empty", nil, nil))
}

// zeros is an endless reader of zero bytes.
type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

func TestServerDiesMidCall(t *testing.T) {
	started := make(chan struct{})
	hanging := make(chan struct{}, 2)
	ts := startServer(t, ServerConfig{}, func(s *Server) {
		s.Handle("die", func(ctx context.Context, c *Conn, args msgpack.RawMessage) (any, error) {
			close(started)
			c.nc.Close() // the socket goes away under the handler, as in a crash
			<-ctx.Done()
			return "too late", nil
		})
		s.Handle("hang", func(ctx context.Context, c *Conn, args msgpack.RawMessage) (any, error) {
			hanging <- struct{}{}
			<-ctx.Done()
			return nil, ctx.Err()
		})
	})
	c := ts.dial(t, DialOptions{})
	other := ts.dial(t, DialOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), guard)
	defer cancel()

	// A second call pending on the same connection fails too.
	hung := make(chan error, 1)
	go func() { hung <- c.Call(ctx, "hang", nil, nil) }()
	<-hanging
	err := c.Call(ctx, "die", nil, nil)
	<-started
	check.ErrorIs(t, err, ErrUnavailable)
	check.Error(t, err, "connection to "+ts.addr+" lost")
	check.ErrorIs(t, <-hung, ErrUnavailable)
	select {
	case <-c.Done():
	case <-ctx.Done():
		t.Fatal("Done not closed")
	}
	check.ErrorIs(t, c.Err(), ErrUnavailable)
	check.ErrorIs(t, c.Call(ctx, "hang", nil, nil), ErrUnavailable)
	check.ErrorIs(t, c.Upload(ctx, "x", "y", 1, strings.NewReader("z")), ErrUnavailable)
	check.True(t, other.Err() == nil, "other connections live on")

	// The whole server stopping: a pending call fails with ErrUnavailable.
	go func() { hung <- other.Call(ctx, "hang", nil, nil) }()
	<-hanging
	ts.stop()
	check.ErrorIs(t, <-hung, ErrUnavailable)
}

func TestServeStopsOnCancel(t *testing.T) {
	before := runtime.NumGoroutine()
	started := make(chan struct{}, 10)
	srv := NewServer(ServerConfig{Logger: newLogSink(t).logger()})
	srv.Handle("hang", func(ctx context.Context, c *Conn, args msgpack.RawMessage) (any, error) {
		started <- struct{}{}
		<-ctx.Done()
		return nil, ctx.Err()
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	check.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx, ln) }()

	dctx, dcancel := context.WithTimeout(context.Background(), guard)
	defer dcancel()
	var clients []*Client
	calls := make(chan error, 6)
	for range 3 {
		c, err := Dial(dctx, ln.Addr().String(), DialOptions{Logger: newLogSink(t).logger()})
		check.NoError(t, err)
		clients = append(clients, c)
		for range 2 {
			go func() { calls <- c.Call(dctx, "hang", nil, nil) }()
		}
	}
	// A connection that never finishes its hello.
	idle, err := net.Dial("tcp", ln.Addr().String())
	check.NoError(t, err)
	defer idle.Close()
	for range 6 {
		<-started
	}

	cancel()
	select {
	case err := <-served:
		check.NoError(t, err)
	case <-time.After(guard):
		t.Fatal("Serve did not return")
	}
	for range 6 {
		check.ErrorIs(t, <-calls, ErrUnavailable)
	}
	for _, c := range clients {
		check.NoError(t, c.Close())
		check.NoError(t, c.Close(), "Close is idempotent")
	}
	idle.Close()
	check.NoError(t, srv.Close())
	check.NoError(t, srv.Close(), "Close is idempotent")
	check.Error(t, srv.Serve(context.Background(), ln), "server closed")

	// Every goroutine the server and the clients started has ended.
	deadline := time.Now().Add(guard)
	for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > before {
		buf := make([]byte, 1<<20)
		t.Fatalf("%d goroutines before, %d after:\n%s", before, n, buf[:runtime.Stack(buf, true)])
	}
}

func TestServerClose(t *testing.T) {
	ts := startServer(t, ServerConfig{}, basicHandlers)
	c := ts.dial(t, DialOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), guard)
	defer cancel()
	check.NoError(t, c.Call(ctx, "empty", nil, nil))
	check.NoError(t, ts.Close())
	select {
	case <-c.Done():
	case <-ctx.Done():
		t.Fatal("client not told")
	}
	check.ErrorIs(t, c.Call(ctx, "empty", nil, nil), ErrUnavailable)
}

type sessionKey struct{}

func TestConnState(t *testing.T) {
	disconnected := make(chan string, 1)
	ts := startServer(t, ServerConfig{
		OnConnect: func(ctx context.Context, c *Conn) error {
			c.SetValue(sessionKey{}, "session-for-"+c.Role().String())
			return nil
		},
		OnDisconnect: func(c *Conn) {
			disconnected <- c.Value(sessionKey{}).(string)
		},
	}, func(s *Server) {
		s.Handle("session", func(ctx context.Context, c *Conn, args msgpack.RawMessage) (any, error) {
			return c.Value(sessionKey{}), nil
		})
	})
	c := ts.dial(t, DialOptions{Role: RoleDevice})
	ctx, cancel := context.WithTimeout(context.Background(), guard)
	defer cancel()
	var s string
	check.NoError(t, c.Call(ctx, "session", nil, &s))
	check.Equal(t, s, "session-for-device")
	check.NoError(t, c.Close())
	check.Equal(t, <-disconnected, "session-for-device")

	t.Run("refused by OnConnect", func(t *testing.T) {
		var disconnects atomic.Int32
		ts := startServer(t, ServerConfig{
			OnConnect: func(ctx context.Context, c *Conn) error {
				return fmt.Errorf("device %q is in an exclusive session: %w", "cpu0", ErrBusy)
			},
			OnDisconnect: func(c *Conn) { disconnects.Add(1) },
		}, basicHandlers)
		_, err := Dial(ctx, ts.addr, DialOptions{})
		check.ErrorIs(t, err, ErrBusy)
		check.Error(t, err, `connection refused: device "cpu0" is in an exclusive session: busy`)
		check.Equal(t, disconnects.Load(), int32(0), "OnDisconnect only for admitted connections")
	})
}

func TestServeConn(t *testing.T) {
	srv := NewServer(ServerConfig{Logger: newLogSink(t).logger()})
	basicHandlers(srv)
	a, b := net.Pipe()
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- srv.ServeConn(ctx, a) }()
	dctx, dcancel := context.WithTimeout(context.Background(), guard)
	defer dcancel()
	c, err := NewClient(dctx, b, DialOptions{Role: RoleWorker, Logger: newLogSink(t).logger()})
	check.NoError(t, err)
	var role string
	check.NoError(t, c.Call(dctx, "role", nil, &role))
	check.Equal(t, role, "worker")
	cancel()
	check.NoError(t, <-served)
	<-c.Done()
	c.Close()
}

// TestAuthFailureLimit: a peer that keeps sending wrong tokens is refused
// unchecked after MaxAuthFailures of them, the right token included, and
// told why; the token check (here a counting Authenticate) is not called
// for it any more.
func TestAuthFailureLimit(t *testing.T) {
	var checks atomic.Int32
	ts := startServer(t, ServerConfig{MaxAuthFailures: 3, Authenticate: func(token string, role Role) (string, error) {
		checks.Add(1)
		if token != "right" {
			return "", ErrUnauthorized
		}
		return "alice", nil
	}}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), guard)
	defer cancel()
	c, err := Dial(ctx, ts.addr, DialOptions{Token: "right"})
	check.NoError(t, err)
	c.Close()
	for i := range 20 {
		_, err := Dial(ctx, ts.addr, DialOptions{Token: fmt.Sprintf("guess-%d", i)})
		check.ErrorIs(t, err, ErrUnauthorized)
		if i >= 3 {
			check.Error(t, err, "too many wrong tokens from this address")
		}
	}
	check.Equal(t, checks.Load(), int32(1+3), "token checks")
	_, err = Dial(ctx, ts.addr, DialOptions{Token: "right"})
	check.Error(t, err, "too many wrong tokens from this address; retry in")
	check.Equal(t, checks.Load(), int32(1+3), "token checks")
}
