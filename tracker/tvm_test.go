package tracker

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/rpcserver/proto"
)

// tvmPeer speaks TVM's tracker protocol exactly as python/tvm/rpc/base.py
// does: the magic as a little-endian int32, then sendjson/recvjson frames.
type tvmPeer struct {
	t  testing.TB
	nc net.Conn
}

func dialTVM(t testing.TB, addr string) *tvmPeer {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	check.NoError(t, err)
	t.Cleanup(func() { nc.Close() })
	nc.SetDeadline(time.Now().Add(guard))
	var b [4]byte
	binary.LittleEndian.PutUint32(b[:], tvmMagic)
	_, err = nc.Write(b[:])
	check.NoError(t, err)
	_, err = io.ReadFull(nc, b[:])
	check.NoError(t, err)
	check.Equal(t, int32(binary.LittleEndian.Uint32(b[:])), int32(tvmMagic), "magic echoed")
	return &tvmPeer{t: t, nc: nc}
}

func (p *tvmPeer) send(v any) {
	p.t.Helper()
	data, err := json.Marshal(v)
	check.NoError(p.t, err)
	var b [4]byte
	binary.LittleEndian.PutUint32(b[:], uint32(len(data)))
	_, err = p.nc.Write(append(b[:], data...))
	check.NoError(p.t, err)
}

func (p *tvmPeer) recv() any {
	p.t.Helper()
	var b [4]byte
	_, err := io.ReadFull(p.nc, b[:])
	check.NoError(p.t, err)
	data := make([]byte, binary.LittleEndian.Uint32(b[:]))
	_, err = io.ReadFull(p.nc, data)
	check.NoError(p.t, err)
	var v any
	check.NoError(p.t, json.Unmarshal(data, &v))
	return v
}

func (p *tvmPeer) call(v any) any {
	p.t.Helper()
	p.send(v)
	return p.recv()
}

func TestTVMProtocol(t *testing.T) {
	cfg := fastConfig(t)
	cfg.TVMListen = "127.0.0.1:0"
	tr := startTracker(t, cfg)
	device(t, tr.Addr(), "kilnkey", proto.NodeAttrs{})

	// A TVM rpc server registers as python/tvm/rpc/server.py does.
	srv := dialTVM(t, tr.TVMAddr())
	check.Equal(t, srv.call([]any{tvmUpdateInfo, map[string]any{"key": "server:rasp", "addr": []any{nil, 9091}}}), any(float64(tvmSuccess)))
	check.Equal(t, srv.call([]any{tvmPut, "rasp", []any{9091, "rasp:0.123"}, nil}), any(float64(tvmSuccess)))
	check.Equal(t, srv.call([]any{tvmGetPendingMatchkeys}), any([]any{"rasp:0.123"}))

	cli := dialTVM(t, tr.TVMAddr())
	check.Equal(t, cli.call([]any{tvmPing}), any(float64(tvmSuccess)))

	t.Run("summary", func(t *testing.T) {
		rep := cli.call([]any{tvmSummary}).([]any)
		check.Equal(t, rep[0], any(float64(tvmSuccess)))
		sum := rep[1].(map[string]any)
		qi := sum["queue_info"].(map[string]any)
		check.Equal(t, qi["rasp"], any(map[string]any{"free": float64(1), "pending": float64(0)}))
		_, leaked := qi["kilnkey"]
		check.True(t, !leaked, "a kiln device's key reached a TVM peer:", qi)
		keys := map[string]any{}
		for _, s := range sum["server_info"].([]any) {
			m := s.(map[string]any)
			keys[m["key"].(string)] = m["addr"]
		}
		check.Equal(t, keys["server:rasp"], any([]any{"127.0.0.1", float64(9091)}), "addr host filled in")
		_, leaked = keys["server:kilnkey"]
		check.True(t, !leaked, "a kiln device reached a TVM peer's server list:", keys)
		ts := tr.Summary(0).TVMServers
		check.Equal(t, ts, []proto.TVMServerSummary{{Key: "rasp", Addr: "127.0.0.1:9091", Free: 1}})
	})

	t.Run("request", func(t *testing.T) {
		check.Equal(t, cli.call([]any{tvmRequest, "rasp", "", 1}), any([]any{float64(tvmSuccess), []any{"127.0.0.1", float64(9091), "rasp:0.123"}}))
		check.Equal(t, srv.call([]any{tvmGetPendingMatchkeys}), any([]any{}))
	})

	t.Run("priority among waiting requests", func(t *testing.T) {
		low, high := dialTVM(t, tr.TVMAddr()), dialTVM(t, tr.TVMAddr())
		low.send([]any{tvmRequest, "rasp", "", 1})
		eventually(t, "low queued", func() bool { _, p := tr.tvm.counts(); return p == 1 })
		high.send([]any{tvmRequest, "rasp", "", 5})
		eventually(t, "high queued", func() bool { _, p := tr.tvm.counts(); return p == 2 })
		check.Equal(t, srv.call([]any{tvmPut, "rasp", []any{9091, "rasp:0.456"}, "10.0.0.9"}), any(float64(tvmSuccess)))
		check.Equal(t, high.recv(), any([]any{float64(tvmSuccess), []any{"10.0.0.9", float64(9091), "rasp:0.456"}}))
		check.Equal(t, srv.call([]any{tvmPut, "rasp", []any{9091, "rasp:0.789"}, nil}), any(float64(tvmSuccess)))
		check.Equal(t, low.recv(), any([]any{float64(tvmSuccess), []any{"127.0.0.1", float64(9091), "rasp:0.789"}}))
	})

	t.Run("a server listed once however often it puts itself", func(t *testing.T) {
		check.Equal(t, srv.call([]any{tvmPut, "rasp", []any{9091, "rasp:0.999"}, nil}), any(float64(tvmSuccess)))
		check.Equal(t, tr.Summary(0).TVMServers, []proto.TVMServerSummary{{Key: "rasp", Addr: "127.0.0.1:9091", Free: 1}})
		check.Equal(t, cli.call([]any{tvmRequest, "rasp", "", 1}), any([]any{float64(tvmSuccess), []any{"127.0.0.1", float64(9091), "rasp:0.999"}}))
		check.Equal(t, tr.Summary(0).TVMServers, []proto.TVMServerSummary{{Key: "rasp", Addr: "127.0.0.1:9091", Free: 0}})
	})

	t.Run("stop without the key fails", func(t *testing.T) {
		check.Equal(t, cli.call([]any{tvmStop, "guess"}), any(float64(tvmFail)))
	})

	t.Run("closed server leaves the pool", func(t *testing.T) {
		check.Equal(t, srv.call([]any{tvmPut, "rasp", []any{9091, "rasp:1"}, nil}), any(float64(tvmSuccess)))
		srv.nc.Close()
		eventually(t, "server removed", func() bool { s, _ := tr.tvm.counts(); return s == 0 })
	})
}

func TestTVMStopKey(t *testing.T) {
	cfg := fastConfig(t)
	cfg.TVMListen = "127.0.0.1:0"
	cfg.TVMStopKey = "tracker:stop"
	tr := startTracker(t, cfg)
	p := dialTVM(t, tr.TVMAddr())
	check.Equal(t, p.call([]any{tvmStop, "tracker:stop"}), any(float64(tvmSuccess)))
	select {
	case err := <-tr.errc:
		check.NoError(t, err)
		close(tr.errc)
	case <-time.After(guard):
		t.Fatal("STOP did not stop the tracker")
	}
}

func TestTVMMalformed(t *testing.T) {
	cfg := fastConfig(t)
	cfg.TVMListen = "127.0.0.1:0"
	tr := startTracker(t, cfg)
	frame := func(s string) []byte {
		b := binary.LittleEndian.AppendUint32(nil, uint32(len(s)))
		return append(b, s...)
	}
	tests := []struct {
		name string
		data []byte
	}{
		{"negative length", binary.LittleEndian.AppendUint32(nil, 0xffffffff)},
		{"zero length", binary.LittleEndian.AppendUint32(nil, 0)},
		{"oversized", binary.LittleEndian.AppendUint32(nil, tvmMaxMessage+1)},
		{"not json", frame("[1,")},
		{"not a list", frame(`{"a":1}`)},
		{"empty list", frame(`[]`)},
		{"unknown code", frame(`[42]`)},
		{"fractional code", frame(`[1.5]`)},
		{"put without port", frame(`[3, "k"]`)},
		{"put bad port", frame(`[3, "k", [70000, "k:1"]]`)},
		{"request short", frame(`[4, "k"]`)},
		{"update_info not object", frame(`[5, [1]]`)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := dialTVM(t, tr.TVMAddr())
			_, err := p.nc.Write(tc.data)
			check.NoError(t, err)
			var b [1]byte
			_, err = p.nc.Read(b[:])
			check.True(t, errors.Is(err, io.EOF), "connection closed without a reply", err)
		})
	}
	t.Run("wrong magic", func(t *testing.T) {
		nc, err := net.Dial("tcp", tr.TVMAddr())
		check.NoError(t, err)
		defer nc.Close()
		nc.SetDeadline(time.Now().Add(guard))
		_, err = nc.Write([]byte("KILN"))
		check.NoError(t, err)
		var b [1]byte
		_, err = nc.Read(b[:])
		check.True(t, errors.Is(err, io.EOF), "closed", err)
	})
	// The tracker still serves after all that.
	p := dialTVM(t, tr.TVMAddr())
	check.Equal(t, p.call([]any{tvmPing}), any(float64(tvmSuccess)))
}

func FuzzTVMFrame(f *testing.F) {
	f.Add(binary.LittleEndian.AppendUint32(nil, 3), []byte("[1]"))
	f.Add(binary.LittleEndian.AppendUint32(nil, 28), []byte(`[3, "k", [9091, "k:1"], null]`))
	f.Add(binary.LittleEndian.AppendUint32(nil, 17), []byte(`[4, "k", "", 1.0]`))
	f.Add(binary.LittleEndian.AppendUint32(nil, 36), []byte(`[5, {"key": "server:k", "addr": [null, 1]}]`))
	f.Add(binary.LittleEndian.AppendUint32(nil, 0x7fffffff), []byte{})
	f.Fuzz(func(t *testing.T, hdr, body []byte) {
		r := io.MultiReader(bytes.NewReader(hdr), bytes.NewReader(body))
		b, err := readTVMFrame(r)
		if err != nil {
			return
		}
		if len(b) == 0 || len(b) > tvmMaxMessage {
			t.Fatalf("frame of %d bytes accepted", len(b))
		}
		m, err := decodeTVMMessage(b)
		if err != nil {
			if !errors.Is(err, errTVMFrame) {
				t.Fatalf("error %v does not wrap errTVMFrame", err)
			}
			return
		}
		if m.Code < tvmPing || m.Code > tvmGetPendingMatchkeys {
			t.Fatalf("code %d accepted", m.Code)
		}
	})
}

// TestTVMLimits: one unauthenticated TVM peer cannot make the tracker hold
// without bound: past tvmMaxPuts keys its PUT fails and the connection is
// closed, and its info keys stop at tvmMaxInfoKeys; the listener goes on
// serving others.
func TestTVMLimits(t *testing.T) {
	cfg := fastConfig(t)
	cfg.TVMListen = "127.0.0.1:0"
	tr := startTracker(t, cfg)
	p := dialTVM(t, tr.TVMAddr())
	info := map[string]any{}
	for i := range 2 * tvmMaxInfoKeys {
		info[fmt.Sprint("k", i)] = i
	}
	check.Equal(t, p.call([]any{tvmUpdateInfo, info}), any(float64(tvmSuccess)))
	for i := range tvmMaxPuts {
		check.Equal(t, p.call([]any{tvmPut, fmt.Sprint("key", i), []any{9000, fmt.Sprint("m", i)}, nil}), any(float64(tvmSuccess)))
	}
	tr.tvm.mu.Lock()
	for c := range tr.tvm.conns {
		check.True(t, len(c.info) <= tvmMaxInfoKeys, "info keys held:", len(c.info))
	}
	tr.tvm.mu.Unlock()
	check.Equal(t, p.call([]any{tvmPut, "one-too-many", []any{9000, "mx"}, nil}), any(float64(tvmFail)))
	var b [1]byte
	_, err := p.nc.Read(b[:])
	check.True(t, err != nil, "the connection past its limits stays open")
	eventually(t, "its servers are forgotten", func() bool { s, _ := tr.tvm.counts(); return s == 0 })
	other := dialTVM(t, tr.TVMAddr())
	check.Equal(t, other.call([]any{tvmPing}), any(float64(tvmSuccess)))
}

// TestTVMSummaryKeysWithColon: meta_schedule's count_num_servers() splits
// every server_info key on ':' into exactly two parts ("server:KEY") and
// raises for all keys otherwise. A kiln device whose key holds a ':' must
// not reach the TVM side's SUMMARY and break it for everyone.
func TestTVMSummaryKeysWithColon(t *testing.T) {
	cfg := fastConfig(t)
	cfg.TVMListen = "127.0.0.1:0"
	tr := startTracker(t, cfg)
	device(t, tr.Addr(), "cpu:fast", proto.NodeAttrs{})
	srv := dialTVM(t, tr.TVMAddr())
	check.Equal(t, srv.call([]any{tvmUpdateInfo, map[string]any{"key": "server:rasp"}}), any(float64(tvmSuccess)))
	check.Equal(t, srv.call([]any{tvmPut, "rasp", []any{9091, "rasp:0.1"}, nil}), any(float64(tvmSuccess)))

	rep := dialTVM(t, tr.TVMAddr()).call([]any{tvmSummary}).([]any)
	check.Equal(t, rep[0], any(float64(tvmSuccess)))
	var keys []string
	for _, s := range rep[1].(map[string]any)["server_info"].([]any) {
		key := s.(map[string]any)["key"].(string)
		keys = append(keys, key)
		check.Equal(t, len(strings.Split(key, ":")), 2, "count_num_servers would raise on", key)
	}
	check.Equal(t, keys, []string{"server:rasp"})
}

// TestTVMPeerCap: one peer opening more connections than the whole TVM
// listener holds gets TVMMaxConnsPerPeer of them; a TVM client from
// another address still gets in and is served. The flooding peer dials
// from 127.0.0.2, another loopback address.
func TestTVMPeerCap(t *testing.T) {
	cfg := fastConfig(t)
	cfg.TVMListen = "127.0.0.1:0"
	tr := startTracker(t, cfg)
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}}
	held := 0
	for range tvmMaxConns + 6 {
		nc, err := d.Dial("tcp", tr.TVMAddr())
		if err != nil {
			t.Skipf("cannot dial from 127.0.0.2: %v", err)
		}
		t.Cleanup(func() { nc.Close() })
		nc.SetDeadline(time.Now().Add(guard))
		var b [4]byte
		binary.LittleEndian.PutUint32(b[:], tvmMagic)
		if _, err := nc.Write(b[:]); err == nil {
			if _, err := io.ReadFull(nc, b[:]); err == nil {
				held++
			}
		}
	}
	check.Equal(t, held, DefaultTVMMaxConnsPerPeer, "connections the flooding peer holds")
	cli := dialTVM(t, tr.TVMAddr())
	check.Equal(t, cli.call([]any{tvmPing}), any(float64(tvmSuccess)))
}

// TestTVMIdleTimeout: a connection that sends nothing after its handshake
// is closed after TVMIdleTimeout; one that waits for a server outlives
// it and is served when a server puts itself; one that keeps asking (as
// TVM's rpc servers do) stays.
func TestTVMIdleTimeout(t *testing.T) {
	cfg := fastConfig(t)
	cfg.TVMListen = "127.0.0.1:0"
	cfg.TVMIdleTimeout = 200 * time.Millisecond
	tr := startTracker(t, cfg)

	idle := dialTVM(t, tr.TVMAddr())
	waiter := dialTVM(t, tr.TVMAddr())
	waiter.send([]any{tvmRequest, "late", "", 1})
	// The idle one is closed; the waiter outlives it, and the server's
	// three idle timeouts more.
	_, err := idle.nc.Read(make([]byte, 1))
	check.ErrorIs(t, err, io.EOF)
	srv := dialTVM(t, tr.TVMAddr())
	for range 3 {
		check.Equal(t, srv.call([]any{tvmGetPendingMatchkeys}), any([]any{}))
		time.Sleep(cfg.TVMIdleTimeout / 2)
	}
	check.Equal(t, srv.call([]any{tvmPut, "late", []any{9091, "late:1"}, nil}), any(float64(tvmSuccess)))
	check.Equal(t, waiter.recv(), any([]any{float64(tvmSuccess), []any{"127.0.0.1", float64(9091), "late:1"}}))
}
