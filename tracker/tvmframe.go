package tracker

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
)

// The Apache TVM tracker protocol (python/tvm/rpc/base.py, tracker.py): a
// 4-byte handshake, then frames of an int32 little-endian length and that
// many bytes of JSON, each a list whose first element is a TrackerCode.
const (
	tvmMagic      = 0x2F271
	tvmMaxMessage = 1 << 20 // TVM's MAX_TRACKER_MSG_BYTES

	tvmFail                = -1
	tvmSuccess             = 0
	tvmPing                = 1
	tvmStop                = 2
	tvmPut                 = 3
	tvmRequest             = 4
	tvmUpdateInfo          = 5
	tvmSummary             = 6
	tvmGetPendingMatchkeys = 7
)

// errTVMFrame marks a malformed TVM frame or message: the connection is closed.
var errTVMFrame = errors.New("malformed TVM tracker message")

// readTVMFrame reads one frame's JSON bytes.
func readTVMFrame(r io.Reader) ([]byte, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return nil, err
	}
	n := int32(binary.LittleEndian.Uint32(hdr[:]))
	if n <= 0 || n > tvmMaxMessage {
		return nil, fmt.Errorf("frame length %d outside (0, %d]: %w", n, tvmMaxMessage, errTVMFrame)
	}
	buf := make([]byte, n)
	if _, err := io.ReadFull(r, buf); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return nil, fmt.Errorf("frame of %d bytes: %w", n, err)
	}
	return buf, nil
}

// encodeTVMFrame returns v as JSON behind its int32 little-endian length.
func encodeTVMFrame(v any) ([]byte, error) {
	data, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("encode TVM message: %w", err)
	}
	out := make([]byte, 4, 4+len(data))
	binary.LittleEndian.PutUint32(out, uint32(len(data)))
	return append(out, data...), nil
}

// tvmMessage is a decoded TVM tracker message; which fields are set
// depends on Code.
type tvmMessage struct {
	Code     int
	Key      string         // PUT, REQUEST
	Port     int            // PUT
	MatchKey string         // PUT
	Addr     string         // PUT: the server's custom address, "" for none
	User     string         // REQUEST
	Priority int            // REQUEST
	Info     map[string]any // UPDATE_INFO
	StopKey  string         // STOP
}

// decodeTVMMessage parses one frame's JSON into a tvmMessage, checking its
// shape for the code.
func decodeTVMMessage(b []byte) (tvmMessage, error) {
	var args []json.RawMessage
	if err := json.Unmarshal(b, &args); err != nil {
		return tvmMessage{}, fmt.Errorf("want a JSON list: %v: %w", err, errTVMFrame)
	}
	if len(args) == 0 {
		return tvmMessage{}, fmt.Errorf("empty list: %w", errTVMFrame)
	}
	var m tvmMessage
	var err error
	if m.Code, err = jsonInt(args[0]); err != nil {
		return m, fmt.Errorf("code: %w", err)
	}
	need := func(n int) error {
		if len(args) < n {
			return fmt.Errorf("code %d needs %d elements, got %d: %w", m.Code, n, len(args), errTVMFrame)
		}
		return nil
	}
	switch m.Code {
	case tvmPing, tvmSummary, tvmGetPendingMatchkeys:
	case tvmStop:
		if err := need(2); err != nil {
			return m, err
		}
		if err := json.Unmarshal(args[1], &m.StopKey); err != nil {
			return m, fmt.Errorf("STOP key: %v: %w", err, errTVMFrame)
		}
	case tvmPut:
		if err := need(3); err != nil {
			return m, err
		}
		if err := json.Unmarshal(args[1], &m.Key); err != nil {
			return m, fmt.Errorf("PUT key: %v: %w", err, errTVMFrame)
		}
		var pm []json.RawMessage
		if err := json.Unmarshal(args[2], &pm); err != nil || len(pm) != 2 {
			return m, fmt.Errorf("PUT wants [port, matchkey]: %w", errTVMFrame)
		}
		if m.Port, err = jsonInt(pm[0]); err != nil || m.Port <= 0 || m.Port > 65535 {
			return m, fmt.Errorf("PUT port: bad port: %w", errTVMFrame)
		}
		if err := json.Unmarshal(pm[1], &m.MatchKey); err != nil {
			return m, fmt.Errorf("PUT matchkey: %v: %w", err, errTVMFrame)
		}
		if len(args) >= 4 && string(args[3]) != "null" {
			if err := json.Unmarshal(args[3], &m.Addr); err != nil {
				return m, fmt.Errorf("PUT custom address: %v: %w", err, errTVMFrame)
			}
		}
	case tvmRequest:
		if err := need(4); err != nil {
			return m, err
		}
		if err := json.Unmarshal(args[1], &m.Key); err != nil {
			return m, fmt.Errorf("REQUEST key: %v: %w", err, errTVMFrame)
		}
		if string(args[2]) != "null" {
			if err := json.Unmarshal(args[2], &m.User); err != nil {
				return m, fmt.Errorf("REQUEST user: %v: %w", err, errTVMFrame)
			}
		}
		if m.Priority, err = jsonInt(args[3]); err != nil {
			return m, fmt.Errorf("REQUEST priority: %w", err)
		}
	case tvmUpdateInfo:
		if err := need(2); err != nil {
			return m, err
		}
		if err := json.Unmarshal(args[1], &m.Info); err != nil || m.Info == nil {
			return m, fmt.Errorf("UPDATE_INFO wants an object: %w", errTVMFrame)
		}
	default:
		return m, fmt.Errorf("unknown tracker code %d: %w", m.Code, errTVMFrame)
	}
	return m, nil
}

// jsonInt decodes an integral JSON number (Python may send 1 or 1.0).
func jsonInt(b json.RawMessage) (int, error) {
	var f float64
	if err := json.Unmarshal(b, &f); err != nil {
		return 0, fmt.Errorf("want a number, got %.20q: %w", b, errTVMFrame)
	}
	if f != math.Trunc(f) || f < math.MinInt32 || f > math.MaxInt32 {
		return 0, fmt.Errorf("want an int32, got %v: %w", f, errTVMFrame)
	}
	return int(f), nil
}
