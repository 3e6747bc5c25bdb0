package proto

import (
	"encoding/binary"
	"fmt"
)

// Bounds on the shape of one msgpack frame payload, checked before it is
// decoded: the decoder recurses into nested arrays and maps, so a frame
// nesting millions of them would overflow the goroutine stack (fatal, not
// recoverable), and one announcing millions of elements would make it
// allocate for them.
const (
	// MaxNesting is the deepest nesting of arrays and maps in a frame.
	// kiln's own messages nest a few levels.
	MaxNesting = 64
	// MaxElements is the most values (array items, map keys and values,
	// scalars) one frame may hold.
	MaxElements = 1 << 22
)

// scanMsgpack checks that b is exactly one well-formed msgpack value
// within MaxNesting and MaxElements, without recursion and without
// allocating for what it announces. The error names the limit and the
// byte offset.
func scanMsgpack(b []byte) error {
	// stack holds, per open array or map, the values still to read in it.
	var stack []uint64
	pending := uint64(1) // values to read at the top level
	elements := 0
	pos := 0
	need := func(n uint64) error {
		if uint64(len(b)-pos) < n {
			return fmt.Errorf("msgpack value at byte %d needs %d bytes, %d left", pos, n, len(b)-pos)
		}
		return nil
	}
	for {
		for pending == 0 {
			if len(stack) == 0 {
				if pos != len(b) {
					return fmt.Errorf("%d bytes after the msgpack value", len(b)-pos)
				}
				return nil
			}
			pending = stack[len(stack)-1]
			stack = stack[:len(stack)-1]
		}
		if pos >= len(b) {
			return fmt.Errorf("msgpack value truncated at byte %d", pos)
		}
		elements++
		if elements > MaxElements {
			return fmt.Errorf("msgpack frame holds more than %d values", MaxElements)
		}
		pending--
		start := pos
		c := b[pos]
		pos++
		var skip, count uint64 // bytes to skip; values a container holds
		container := false
		switch {
		case c <= 0x7f || c >= 0xe0 || c == 0xc0 || c == 0xc2 || c == 0xc3:
		case c >= 0x80 && c <= 0x8f:
			container, count = true, 2*uint64(c&0x0f)
		case c >= 0x90 && c <= 0x9f:
			container, count = true, uint64(c&0x0f)
		case c >= 0xa0 && c <= 0xbf:
			skip = uint64(c & 0x1f)
		default:
			var err error
			skip, count, container, err = scanHeader(b, &pos, c)
			if err != nil {
				return fmt.Errorf("msgpack value at byte %d: %w", start, err)
			}
		}
		if container {
			// Every value takes at least one byte: a count past what is
			// left is a lie, refused before anything trusts it.
			if err := need(count); err != nil {
				return err
			}
			if count == 0 {
				continue
			}
			if len(stack) >= MaxNesting {
				return fmt.Errorf("msgpack nesting deeper than %d levels at byte %d", MaxNesting, start)
			}
			stack = append(stack, pending)
			pending = count
			continue
		}
		if err := need(skip); err != nil {
			return err
		}
		pos += int(skip)
	}
}

// scanHeader reads the length bytes of a msgpack format c at *pos (just
// past c) and returns the payload bytes to skip, or, for an array or map,
// the values it holds.
func scanHeader(b []byte, pos *int, c byte) (skip, count uint64, container bool, err error) {
	read := func(n int) (uint64, error) {
		if len(b)-*pos < n {
			return 0, fmt.Errorf("truncated length")
		}
		var v uint64
		switch n {
		case 1:
			v = uint64(b[*pos])
		case 2:
			v = uint64(binary.BigEndian.Uint16(b[*pos:]))
		case 4:
			v = uint64(binary.BigEndian.Uint32(b[*pos:]))
		}
		*pos += n
		return v, nil
	}
	switch c {
	case 0xca: // float32
		return 4, 0, false, nil
	case 0xcb: // float64
		return 8, 0, false, nil
	case 0xcc, 0xd0: // uint8, int8
		return 1, 0, false, nil
	case 0xcd, 0xd1:
		return 2, 0, false, nil
	case 0xce, 0xd2:
		return 4, 0, false, nil
	case 0xcf, 0xd3:
		return 8, 0, false, nil
	case 0xd4, 0xd5, 0xd6, 0xd7, 0xd8: // fixext 1, 2, 4, 8, 16 (+ type byte)
		return 1 + (1 << (c - 0xd4)), 0, false, nil
	case 0xc4, 0xd9: // bin8, str8
		skip, err = read(1)
	case 0xc5, 0xda: // bin16, str16
		skip, err = read(2)
	case 0xc6, 0xdb: // bin32, str32
		skip, err = read(4)
	case 0xc7, 0xc8, 0xc9: // ext8, ext16, ext32 (+ type byte)
		skip, err = read(1 << (c - 0xc7))
		skip++
	case 0xdc:
		count, err = read(2)
		container = true
	case 0xdd:
		count, err = read(4)
		container = true
	case 0xde:
		count, err = read(2)
		count *= 2
		container = true
	case 0xdf:
		count, err = read(4)
		count *= 2
		container = true
	default:
		return 0, 0, false, fmt.Errorf("byte 0x%02x is not a msgpack format", c)
	}
	return skip, count, container, err
}
