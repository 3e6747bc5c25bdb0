package proto

import (
	"bytes"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/kiln-ml/kiln/internal/check"
)

// nested is n msgpack arrays of one element each around a nil.
func nested(n int) []byte {
	return append(bytes.Repeat([]byte{0x91}, n), 0xc0)
}

func TestScanMsgpack(t *testing.T) {
	good := []any{
		nil, true, false, 1, -1, 200, -200, 70000, -70000, 1 << 40, -(1 << 40), uint64(1 << 63),
		float32(1.5), 2.5, "", "short", strings.Repeat("x", 40), strings.Repeat("y", 300), strings.Repeat("z", 70000),
		[]byte{}, []byte("bytes"), bytes.Repeat([]byte{1}, 70000),
		[]any{}, []any{1, "a", []any{2, []any{3}}}, make([]int, 20), make([]int, 70000),
		map[string]any{}, map[string]any{"a": 1, "b": map[string]any{"c": []any{nil}}},
		Request{ID: 1, Method: "m", Args: msgpack.RawMessage{0x93, 1, 2, 3}, Deadline: 5},
	}
	for _, v := range good {
		b, err := msgpack.Marshal(v)
		check.NoError(t, err)
		check.NoError(t, scanMsgpack(b), v)
	}
	check.NoError(t, scanMsgpack(nested(MaxNesting)))
	for _, tc := range []struct {
		name string
		b    []byte
		want string
	}{
		{"empty", nil, "truncated"},
		{"too deep", nested(MaxNesting + 1), "nesting deeper than 64"},
		{"a million deep", nested(1 << 20), "nesting deeper than 64"},
		{"array longer than the frame", []byte{0xdd, 0xff, 0xff, 0xff, 0xff, 0xc0}, "needs 4294967295 bytes"},
		{"map longer than the frame", []byte{0xdf, 0x7f, 0xff, 0xff, 0xff}, "bytes"},
		{"string past the end", []byte{0xdb, 0, 0, 1, 0, 'a'}, "needs 256 bytes"},
		{"truncated length", []byte{0xda, 0x01}, "truncated length"},
		{"reserved byte", []byte{0xc1}, "not a msgpack format"},
		{"trailing bytes", []byte{0xc0, 0xc0}, "1 bytes after"},
		{"array cut short", []byte{0x92, 0x01}, "needs 2 bytes, 1 left"},
		{"value cut short", []byte{0x92, 0x01, 0xcd, 0x01}, "needs 2 bytes, 1 left"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			check.Error(t, scanMsgpack(tc.b), tc.want)
		})
	}
}

// TestDecodeDeepRequest: a request whose arguments nest a million arrays
// is refused as a bad request instead of overflowing the decoder's stack.
func TestDecodeDeepRequest(t *testing.T) {
	args := nested(1 << 20)
	b, err := msgpack.Marshal(Request{ID: 1, Method: "m", Args: args})
	check.NoError(t, err)
	_, err = DecodeRequest(b)
	check.ErrorIs(t, err, ErrBadRequest)
	check.Error(t, err, "nesting deeper than 64")
}

// FuzzScanMsgpack: the scanner never panics, and what it accepts decodes.
func FuzzScanMsgpack(f *testing.F) {
	for _, v := range []any{nil, 1, "s", []any{1, []any{2}}, map[string]any{"k": []byte("v")}, 2.5} {
		b, _ := msgpack.Marshal(v)
		f.Add(b)
	}
	f.Add(nested(70))
	f.Add([]byte{0xdd, 0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		if scanMsgpack(b) != nil {
			return
		}
		var raw msgpack.RawMessage
		if err := msgpack.Unmarshal(b, &raw); err != nil {
			t.Fatalf("scan accepted % x, decode refused it: %v", b, err)
		}
	})
}
