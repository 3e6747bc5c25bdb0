package store

import (
	"fmt"

	"github.com/vmihailenco/msgpack/v5"
)

// The record codec: a string value is stored as its bytes (a module's
// text stays readable and costs no encoding), any other value as msgpack.
// Both backends write what Encode returns and every reader decodes with
// Decode, so a record reads the same from tracker.db, its write-ahead log
// and etcd.

// Encode returns v as stored.
func Encode(v any) ([]byte, error) {
	if s, ok := v.(string); ok {
		return []byte(s), nil
	}
	return msgpack.Marshal(v)
}

// Decode reads a stored value into v, a pointer: a *string takes the
// bytes as they are, anything else is msgpack-decoded.
func Decode(b []byte, v any) error {
	if s, ok := v.(*string); ok {
		*s = string(b)
		return nil
	}
	return msgpack.Unmarshal(b, v)
}

// encoded is a change with its value encoded (Delete: no value), as the
// write-ahead log records it and as a backend writes it.
type encoded struct {
	Table  Table  `msgpack:"t"`
	Key    string `msgpack:"k"`
	Value  []byte `msgpack:"v,omitempty"`
	Delete bool   `msgpack:"d,omitempty"`
}

// encodeChanges encodes changes with the codec; the first value that
// cannot be encoded fails them all, named.
func encodeChanges(changes []Change) ([]encoded, error) {
	out := make([]encoded, len(changes))
	for i, c := range changes {
		out[i] = encoded{Table: c.Table, Key: c.Key}
		if c.Value == nil {
			out[i].Delete = true
			continue
		}
		b, err := Encode(c.Value)
		if err != nil {
			return nil, fmt.Errorf("encode %s/%s: %w", c.Table, c.Key, err)
		}
		out[i].Value = b
	}
	return out, nil
}
