package proto

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"strings"
)

// Magic is the first four bytes of every kiln connection, in both directions.
const Magic = "KILN"

// ProtocolVersion is the version of the wire protocol this kiln speaks. The
// hello's first six bytes (magic and version) keep their layout in every
// version; everything after them may change with the version.
const ProtocolVersion uint16 = 1

// MaxTokenSize is the largest auth token a hello may carry, in bytes.
const MaxTokenSize = 4096

// MaxHelloMessage is the largest message a hello reply may carry, in bytes.
const MaxHelloMessage = 1024

// Role says what the dialing side of a connection is.
type Role uint8

// The roles. Zero is not a role: a hello that carries it is refused.
const (
	RoleClient   Role = 1 // the CLI or the Go SDK
	RoleDevice   Role = 2 // a device daemon (kiln rpcserver)
	RoleCompiler Role = 3 // a compiler node
	RoleTracker  Role = 4 // a tracker
	RoleWorker   Role = 5 // a device daemon's worker subprocess
	// RoleBulk is a connection that carries one bulk transfer as raw
	// bytes after the hello, with no multiplexer (see Server's OnRaw and
	// DialRaw): a file upload at the speed of the socket.
	RoleBulk Role = 6
	// RoleCall is a connection that carries one device session's calls
	// as plain frames, with no multiplexer: after the hello the dialer
	// sends one frame holding a CallTicket (SessionInfo.CallTicket), and
	// the device daemon hands the connection to the session's worker,
	// which answers with one Response frame (ID 1) and then serves the
	// calls itself (see Server's OnRaw and ServeAdopted).
	RoleCall Role = 7
)

// String returns the role's lowercase name.
func (r Role) String() string {
	switch r {
	case RoleClient:
		return "client"
	case RoleDevice:
		return "device"
	case RoleCompiler:
		return "compiler"
	case RoleTracker:
		return "tracker"
	case RoleWorker:
		return "worker"
	case RoleBulk:
		return "bulk"
	case RoleCall:
		return "call"
	}
	return fmt.Sprintf("role(%d)", uint8(r))
}

// Valid reports whether r is one of the defined roles.
func (r Role) Valid() bool { return r >= RoleClient && r <= RoleCall }

// Raw reports whether connections of role r are handed to the listener's
// OnRaw as they are, with no multiplexer.
func (r Role) Raw() bool { return r == RoleBulk || r == RoleCall }

// Status is the listener's verdict on a hello.
type Status uint8

// The hello statuses.
const (
	StatusOK         Status = 0 // accepted: a yamux session follows
	StatusBadVersion Status = 1 // the dialer speaks another protocol version
	StatusBadToken   Status = 2 // the token is wrong
	StatusBadRole    Status = 3 // this listener does not serve the dialer's role
	StatusBadHello   Status = 4 // the hello is malformed (for example, a token too long)
	StatusRefused    Status = 5 // the listener refused the peer; the message is "<code> <text>"
)

// String returns the status's name.
func (s Status) String() string {
	switch s {
	case StatusOK:
		return "ok"
	case StatusBadVersion:
		return "bad version"
	case StatusBadToken:
		return "bad token"
	case StatusBadRole:
		return "bad role"
	case StatusBadHello:
		return "bad hello"
	case StatusRefused:
		return "refused"
	}
	return fmt.Sprintf("status(%d)", uint8(s))
}

// Hello is the first message on a connection, sent by the dialer.
//
//	offset  size  field
//	0       4     magic "KILN"
//	4       2     protocol version, big-endian uint16
//	6       1     role (uint8)
//	7       2     token length N, big-endian uint16, N ≤ MaxTokenSize
//	9       N     token bytes
type Hello struct {
	Version uint16
	Role    Role
	Token   string
}

// HelloReply is the listener's answer to a Hello.
//
//	offset  size  field
//	0       4     magic "KILN"
//	4       2     the listener's protocol version, big-endian uint16
//	6       1     status (uint8)
//	7       2     message length M, big-endian uint16, M ≤ MaxHelloMessage
//	9       M     message bytes (UTF-8): why the hello was refused, or
//	              for ok the listener's kind (ServerConfig.Kind; may be empty)
type HelloReply struct {
	Version uint16
	Status  Status
	Message string
}

// The listener kinds an accepted hello's reply names in its message
// (ServerConfig.Kind). An empty message names none.
const (
	ListenerTracker = "tracker"
	ListenerDevice  = "rpcserver"
)

// PeerKindError is the dial error when the listener is another kind than
// the dialer meant to reach: a device daemon's address given as a
// tracker's, or the other way round. It wraps ErrBadRequest.
type PeerKindError struct {
	Addr      string
	Got, Want string // kinds: ListenerTracker, ListenerDevice
}

func (e *PeerKindError) Error() string {
	return fmt.Sprintf("%s is %s, not %s: pass the address of %s", e.Addr, kindName(e.Got), kindName(e.Want), kindName(e.Want))
}

// Unwrap makes the error match ErrBadRequest.
func (e *PeerKindError) Unwrap() error { return ErrBadRequest }

// kindName describes a listener kind in words.
func kindName(kind string) string {
	switch kind {
	case ListenerTracker:
		return "a kiln tracker"
	case ListenerDevice:
		return "a kiln device daemon (kiln rpcserver)"
	}
	return fmt.Sprintf("a kiln %q listener", kind)
}

// errBadMagic marks a connection whose first bytes are not Magic: the
// listener drops it without a reply, since the peer is not a kiln.
var errBadMagic = errors.New("not a kiln peer")

// WriteHello writes h to w in one write.
func WriteHello(w io.Writer, h Hello) error {
	if len(h.Token) > MaxTokenSize {
		return fmt.Errorf("write hello: token of %d bytes exceeds %d bytes: %w", len(h.Token), MaxTokenSize, ErrTooLarge)
	}
	b := make([]byte, 9, 9+len(h.Token))
	copy(b, Magic)
	binary.BigEndian.PutUint16(b[4:], h.Version)
	b[6] = byte(h.Role)
	binary.BigEndian.PutUint16(b[7:], uint16(len(h.Token)))
	b = append(b, h.Token...)
	if _, err := w.Write(b); err != nil {
		return fmt.Errorf("write hello: %w", err)
	}
	return nil
}

// ReadHello reads a Hello from r. It fails with an error wrapping ErrVersion
// (naming both versions) as soon as it has read a version other than
// ProtocolVersion, without reading further, since the rest of the layout
// belongs to that version; the returned Hello then carries the peer's version.
// Malformed hellos fail with an error wrapping ErrBadRequest.
func ReadHello(r io.Reader) (Hello, error) {
	var head [9]byte
	if _, err := io.ReadFull(r, head[:6]); err != nil {
		return Hello{}, fmt.Errorf("read hello: %w", err)
	}
	if string(head[:4]) != Magic {
		return Hello{}, fmt.Errorf("read hello: first bytes are %q, not %q: %w", head[:4], Magic, errBadMagic)
	}
	h := Hello{Version: binary.BigEndian.Uint16(head[4:6])}
	if h.Version != ProtocolVersion {
		return h, versionError(h.Version)
	}
	if _, err := io.ReadFull(r, head[6:9]); err != nil {
		return h, fmt.Errorf("read hello: %w", err)
	}
	h.Role = Role(head[6])
	n := int(binary.BigEndian.Uint16(head[7:9]))
	if n > MaxTokenSize {
		return h, fmt.Errorf("read hello: token of %d bytes exceeds %d bytes: %w", n, MaxTokenSize, ErrBadRequest)
	}
	if n > 0 {
		tok := make([]byte, n)
		if _, err := io.ReadFull(r, tok); err != nil {
			return h, fmt.Errorf("read hello token: %w", err)
		}
		h.Token = string(tok)
	}
	return h, nil
}

// WriteHelloReply writes rep to w in one write; a message longer than
// MaxHelloMessage is cut.
func WriteHelloReply(w io.Writer, rep HelloReply) error {
	msg := rep.Message
	if len(msg) > MaxHelloMessage {
		msg = msg[:MaxHelloMessage]
	}
	b := make([]byte, 9, 9+len(msg))
	copy(b, Magic)
	binary.BigEndian.PutUint16(b[4:], rep.Version)
	b[6] = byte(rep.Status)
	binary.BigEndian.PutUint16(b[7:], uint16(len(msg)))
	b = append(b, msg...)
	if _, err := w.Write(b); err != nil {
		return fmt.Errorf("write hello reply: %w", err)
	}
	return nil
}

// ReadHelloReply reads a HelloReply from r. It does not interpret the
// status; see HelloReply.Err.
func ReadHelloReply(r io.Reader) (HelloReply, error) {
	var head [9]byte
	if _, err := io.ReadFull(r, head[:]); err != nil {
		return HelloReply{}, fmt.Errorf("read hello reply: %w", err)
	}
	if string(head[:4]) != Magic {
		return HelloReply{}, fmt.Errorf("read hello reply: first bytes are %q, not %q: the peer is not a kiln daemon: %w", head[:4], Magic, ErrBadRequest)
	}
	rep := HelloReply{
		Version: binary.BigEndian.Uint16(head[4:6]),
		Status:  Status(head[6]),
	}
	n := int(binary.BigEndian.Uint16(head[7:9]))
	if n > MaxHelloMessage {
		return rep, fmt.Errorf("read hello reply: message of %d bytes exceeds %d bytes: %w", n, MaxHelloMessage, ErrBadRequest)
	}
	if n > 0 {
		msg := make([]byte, n)
		if _, err := io.ReadFull(r, msg); err != nil {
			return rep, fmt.Errorf("read hello reply message: %w", err)
		}
		rep.Message = string(msg)
	}
	return rep, nil
}

// Err turns a reply into the error the dialer reports: nil for ok, an error
// wrapping ErrVersion, ErrUnauthorized or ErrBadRequest for the statuses of
// those names, and for "refused" an error wrapping the sentinel of the code
// that starts the message.
func (rep HelloReply) Err() error {
	switch {
	case rep.Status == StatusBadVersion || (rep.Status == StatusOK && rep.Version != ProtocolVersion):
		return versionError(rep.Version)
	case rep.Status == StatusOK:
		return nil
	case rep.Status == StatusBadToken && strings.HasPrefix(rep.Message, "authentication failed: "):
		// The listener's reason (a wrong token, or too many of them).
		return newError(CodeUnauthorized, rep.Message)
	case rep.Status == StatusBadToken:
		return newError(CodeUnauthorized, "authentication failed: wrong token")
	case rep.Status == StatusRefused:
		code, msg, _ := strings.Cut(rep.Message, " ")
		return newError(Code(code), "connection refused: "+msg)
	case rep.Status == StatusBadRole:
		return newError(CodeBadRequest, "hello refused: "+rep.Message)
	default:
		return newError(CodeBadRequest, fmt.Sprintf("hello refused (%s): %s", rep.Status, rep.Message))
	}
}

// versionError says both versions: "protocol version mismatch: peer speaks
// 3, this kiln speaks 1".
func versionError(peer uint16) error {
	return newError(CodeVersion, fmt.Sprintf("protocol version mismatch: peer speaks %d, this kiln speaks %d", peer, ProtocolVersion))
}

// tokenEqual compares two tokens in constant time, independent of their
// lengths (both are hashed first).
func tokenEqual(got, want string) bool {
	g := sha256.Sum256([]byte(got))
	w := sha256.Sum256([]byte(want))
	return subtle.ConstantTimeCompare(g[:], w[:]) == 1
}

// TokenEqual compares a token a peer sent with a known one in constant
// time.
func TokenEqual(got, want string) bool { return tokenEqual(got, want) }
