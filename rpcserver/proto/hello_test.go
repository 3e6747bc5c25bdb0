package proto

import (
	"bytes"
	"io"
	"strings"
	"testing"

	"github.com/kiln-ml/kiln/internal/check"
)

func TestHelloLayout(t *testing.T) {
	var buf bytes.Buffer
	check.NoError(t, WriteHello(&buf, Hello{Version: 1, Role: RoleDevice, Token: "ab"}))
	check.Equal(t, buf.Bytes(), []byte{'K', 'I', 'L', 'N', 0, 1, 2, 0, 2, 'a', 'b'})
	h, err := ReadHello(&buf)
	check.NoError(t, err)
	check.Equal(t, h, Hello{Version: 1, Role: RoleDevice, Token: "ab"})

	buf.Reset()
	check.NoError(t, WriteHelloReply(&buf, HelloReply{Version: 1, Status: StatusBadRole, Message: "no"}))
	check.Equal(t, buf.Bytes(), []byte{'K', 'I', 'L', 'N', 0, 1, 3, 0, 2, 'n', 'o'})
	rep, err := ReadHelloReply(&buf)
	check.NoError(t, err)
	check.Equal(t, rep, HelloReply{Version: 1, Status: StatusBadRole, Message: "no"})
}

func TestReadHelloErrors(t *testing.T) {
	cases := []struct {
		name   string
		in     string
		target error
		want   string
	}{
		{"empty", "", io.EOF, "read hello"},
		{"short magic", "KIL", io.ErrUnexpectedEOF, "read hello"},
		{"not kiln", "GET / HTTP/1.1", errBadMagic, `first bytes are "GET ", not "KILN"`},
		{"other version", "KILN\x00\x07", ErrVersion, "protocol version mismatch: peer speaks 7, this kiln speaks 1"},
		{"truncated role", "KILN\x00\x01", io.EOF, "read hello"},
		{"token too long", "KILN\x00\x01\x01\x10\x01", ErrBadRequest, "token of 4097 bytes exceeds 4096 bytes"},
		{"truncated token", "KILN\x00\x01\x01\x00\x05abc", io.ErrUnexpectedEOF, "read hello token"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ReadHello(strings.NewReader(tc.in))
			check.ErrorIs(t, err, tc.target)
			check.Error(t, err, tc.want)
		})
	}
	check.ErrorIs(t, WriteHello(io.Discard, Hello{Token: strings.Repeat("x", MaxTokenSize+1)}), ErrTooLarge)
}

func TestHelloReplyErr(t *testing.T) {
	cases := []struct {
		rep    HelloReply
		target error
		want   string
	}{
		{HelloReply{Version: 1, Status: StatusOK}, nil, ""},
		{HelloReply{Version: 2, Status: StatusBadVersion}, ErrVersion, "protocol version mismatch: peer speaks 2, this kiln speaks 1"},
		{HelloReply{Version: 3, Status: StatusOK}, ErrVersion, "peer speaks 3"},
		{HelloReply{Version: 1, Status: StatusBadToken, Message: "whatever"}, ErrUnauthorized, "authentication failed: wrong token"},
		{HelloReply{Version: 1, Status: StatusBadRole, Message: "this listener does not serve role client"}, ErrBadRequest, "hello refused: this listener does not serve role client"},
		{HelloReply{Version: 1, Status: StatusBadHello, Message: "token too long"}, ErrBadRequest, "hello refused (bad hello): token too long"},
		{HelloReply{Version: 1, Status: 77}, ErrBadRequest, "status(77)"},
	}
	for _, tc := range cases {
		err := tc.rep.Err()
		if tc.target == nil {
			check.NoError(t, err)
			continue
		}
		check.ErrorIs(t, err, tc.target)
		check.Error(t, err, tc.want)
	}
}

func TestTokenEqual(t *testing.T) {
	check.True(t, tokenEqual("abc", "abc"))
	check.True(t, !tokenEqual("abc", "abd"))
	check.True(t, !tokenEqual("abc", "abcd"))
	check.True(t, !tokenEqual("", "x"))
	check.True(t, tokenEqual("", ""))
}

// FuzzReadHello: ReadHello never panics, and what it accepts writes back as
// the same bytes.
func FuzzReadHello(f *testing.F) {
	var seed bytes.Buffer
	WriteHello(&seed, Hello{Version: ProtocolVersion, Role: RoleClient, Token: "token"})
	f.Add(seed.Bytes())
	f.Add([]byte("KILN\x00\x01\x02\x00\x00"))
	f.Add([]byte("KILN\x00\x03\x01\x00\x01t"))
	f.Add([]byte("KILN\x00\x01\x01\xff\xff"))
	f.Add([]byte("GET / HTTP/1.1\r\n"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		h, err := ReadHello(bytes.NewReader(data))
		if err != nil {
			if h.Version != 0 && h.Version != ProtocolVersion {
				check.ErrorIs(t, err, ErrVersion)
			}
			return
		}
		check.True(t, len(h.Token) <= MaxTokenSize)
		var out bytes.Buffer
		check.NoError(t, WriteHello(&out, h))
		check.True(t, bytes.HasPrefix(data, out.Bytes()), "round trip")
	})
}
