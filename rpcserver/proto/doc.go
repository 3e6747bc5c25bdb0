// Package proto owns kiln's wire protocol: the hello, the yamux session, the
// msgpack request and response frames, the error codes and their sentinel
// errors, bulk streams, TLS helpers, and the small RPC endpoint (Server,
// Client) that the device daemon, the tracker, compiler nodes and the client
// SDK build on. Every type that crosses the wire lives here and nowhere else.
//
// proto imports no other kiln package: it sits below rpcserver, tracker and
// client, and must not import them (nor ndarray, packedfunc or devices).
//
// # Connection
//
// A connection is TCP, wrapped in TLS when configured (the caller wraps the
// listener with tls.NewListener and passes a *tls.Config to Dial; TLSConfig
// builds both, with a client CA for mutual TLS). The dialer speaks first.
// Integers are big-endian.
//
// Hello, dialer to listener:
//
//	offset  size  field
//	0       4     magic: the bytes 'K' 'I' 'L' 'N' (0x4b 0x49 0x4c 0x4e)
//	4       2     protocol version (uint16), ProtocolVersion = 1
//	6       1     role (uint8): 1 client, 2 device, 3 compiler, 4 tracker, 5 worker,
//	              6 bulk, 7 call
//	7       2     token length N (uint16), at most 4096
//	9       N     token bytes
//
// Hello reply, listener to dialer:
//
//	offset  size  field
//	0       4     magic "KILN"
//	4       2     the listener's protocol version (uint16)
//	6       1     status (uint8): 0 ok, 1 bad version, 2 bad token, 3 bad role,
//	              4 bad hello, 5 refused
//	7       2     message length M (uint16), at most 1024
//	9       M     message (UTF-8), empty when ok
//
// The first six bytes of both keep this layout in every protocol version;
// the rest belongs to the version. A listener that reads another version
// stops reading, replies "bad version" with its own version, and closes; the
// dialer reports "protocol version mismatch: peer speaks 2, this kiln speaks
// 1" (ErrVersion). A wrong token gets "bad token" and nothing else: the
// dialer reports "authentication failed: wrong token" (ErrUnauthorized).
// Tokens are compared in constant time. "refused" means the listener's
// daemon turned the peer away (a device already in an exclusive session);
// its message is an error code, a space and the text, and the dialer reports
// an error wrapping that code's sentinel. A connection whose first four bytes
// are not "KILN" is logged and dropped without a reply. The whole hello
// runs under a deadline (10 s by default) on both sides.
//
// # Session
//
// After an ok reply both ends run a yamux session (github.com/hashicorp/yamux)
// over the connection, the dialer as yamux client. The dialer opens the first
// stream at once: the control stream. Every later stream the dialer opens is
// a bulk stream. Streams are only opened by the dialer.
//
// An internal link may skip yamux: a dialer that uses NewFrameClient, served
// with Server.ServeFrames, sends its frames on the connection itself right
// after the hello, with no control stream and no bulk streams (the device
// daemon's call link to its worker). A RoleCall connection carries plain
// frames too, once its ticket has been accepted (see SessionInfo.CallTicket
// and Server.ServeAdopted). Other connections always use yamux.
//
// # Frames
//
// On the control stream and at the head of bulk streams, messages are frames:
//
//	offset  size  field
//	0       4     payload length L (uint32), at most the frame limit (64 MiB by default)
//	4       L     payload: one msgpack value, a map with string keys
//
// The dialer sends Request maps {id, method, args, deadline}: id a uint64
// unique among its pending calls and never 0, method a string, args any
// msgpack value (nil when absent), deadline the caller's deadline in Unix
// nanoseconds (0 for none). The listener answers each with a Response map
// {id, result, error}, in any order and concurrently: error is absent or nil
// on success, else a map {code, message}. A request whose deadline has
// passed is answered with code "deadline" without running. A Response with
// id 0 answers no request: the listener sends it just before closing a
// connection that sent an oversized or malformed frame, to say why. Such a
// frame closes that connection only.
//
// # Error codes
//
// code is a string: unauthorized, version, not_found, bad_request, deadline,
// session_expired, crashed, busy, unavailable, internal, cancelled, quota,
// too_large. Each maps to a sentinel (ErrUnauthorized … ErrTooLarge). The
// listener picks the code of a handler's error by errors.Is against the
// sentinels (internal when none) and sends the error's full text as message;
// the Client returns a *WireError that unwraps to the sentinel, so
// errors.Is(err, proto.ErrNotFound) holds on both sides of the wire.
//
// # Bulk streams
//
// Bulk data (artifact uploads, tensor copies) moves on a stream of its own,
// never through msgpack. The dialer writes one frame holding a BulkHeader
// {id, method, name, size, deadline} and then exactly size raw bytes. The
// listener's bulk handler reads them; then the listener writes one frame
// holding a BulkHeader {id, name, size, error} and, when error is absent,
// exactly size raw bytes back (0 for a plain upload), and closes the stream.
// A listener may answer with an error before it has read the upload; the
// dialer then stops sending.
package proto
