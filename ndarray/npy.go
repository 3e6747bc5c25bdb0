package ndarray

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"runtime"
	"strconv"
	"strings"

	"github.com/kiln-ml/kiln/devices"
)

// The .npy format (numpy's NEP 1): the magic "\x93NUMPY", a major and minor
// version byte, the header length (2 bytes little-endian in version 1.0, 4
// in 2.0 and 3.0), then the header: a Python dict literal
// {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), } padded with
// spaces and ended by '\n'; then the elements in C order.
//
// Choices kiln makes:
//
//   - bfloat16. numpy has no bfloat16; the ml_dtypes package registers one,
//     but np.save writes its descr as '<V2' (numpy takes the descr from
//     dtype.str, and a user dtype's type character is 'V'; see
//     jax-ml/ml_dtypes#41), which np.load reads back as two raw bytes with
//     no element type. kiln writes the descr 'bfloat16' instead: np.load
//     reads it as ml_dtypes.bfloat16 when ml_dtypes is imported (importing
//     it registers the name with np.dtype) and fails with "descr is not a
//     valid dtype descriptor" otherwise. ReadNPY reads 'bfloat16' and
//     refuses '<V2' with an error that says why, rather than guessing that
//     two untyped bytes are a bfloat16.
//   - Vector lanes. numpy has no vector dtypes: an array of float32x4 with
//     shape (n,) is written as float32 with shape (n, 4), the lanes as a
//     trailing dimension. It reads back as float32 (n, 4); View turns it
//     back into float32x4 if needed. Sub-byte types (uint1) and handles
//     have no numpy equivalent and are refused.
//   - Bool elements are stored as one byte; on read any non-zero byte
//     becomes 1, so a bool array from a file always holds Go-valid bools.
//   - Only C order is read; fortran_order True is refused.

const (
	npyMagic = "\x93NUMPY"
	// npyAlign is numpy's ARRAY_ALIGN: the header is padded so the data
	// starts at a multiple of it.
	npyAlign = 64
	// npyGrowthDigits is numpy's GROWTH_AXIS_MAX_DIGITS: np.save leaves
	// room after the dict for the first extent to grow to this many
	// digits.
	npyGrowthDigits = 21
	// maxNPYHeader bounds the header kiln reads. np.load refuses headers
	// over 10000 characters by default; kiln allows more, for arrays with
	// many dimensions, but not without bound.
	maxNPYHeader = 1 << 20
	// maxNDim is the most dimensions an NDArray may have.
	maxNDim = 1 << 16
	// streamChunk is the unit in which data of unknown length is read, so
	// a header that lies about the size costs no more memory than the data
	// actually there.
	streamChunk = 1 << 20
)

// ReadNPY reads one array in .npy format (versions 1.0, 2.0 and 3.0) from r
// onto the CPU. It reads no byte past the array's data, so arrays written
// back to back can be read one after another. The CPU backend
// (devices/cpu) must be registered.
func ReadNPY(r io.Reader) (*NDArray, error) {
	a, err := readNPY(r)
	if err != nil {
		return nil, fmt.Errorf("read npy: %w", err)
	}
	return a, nil
}

// LoadNPY reads a .npy file onto the CPU.
func LoadNPY(path string) (*NDArray, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("load npy: %w", err)
	}
	defer f.Close()
	a, err := readNPY(f)
	if err != nil {
		return nil, fmt.Errorf("load npy %q: %w", path, err)
	}
	return a, nil
}

// npyHeader is what a .npy header says.
type npyHeader struct {
	dtype   DType
	swap    bool // the data is big-endian
	shape   Shape
	fortran bool
}

func readNPY(r io.Reader) (*NDArray, error) {
	var pre [10]byte
	if n, err := io.ReadFull(r, pre[:8]); err != nil {
		return nil, fmt.Errorf("magic and version: want 8 bytes, got %d: %w", n, err)
	}
	if string(pre[:6]) != npyMagic {
		return nil, fmt.Errorf("bad magic %q, want %q: not a .npy file", pre[:6], npyMagic)
	}
	major, minor := pre[6], pre[7]
	var hlen int64
	switch {
	case major == 1 && minor == 0:
		if n, err := io.ReadFull(r, pre[8:10]); err != nil {
			return nil, fmt.Errorf("header length: want 2 bytes, got %d: %w", n, err)
		}
		hlen = int64(binary.LittleEndian.Uint16(pre[8:10]))
	case (major == 2 || major == 3) && minor == 0:
		var l [4]byte
		if n, err := io.ReadFull(r, l[:]); err != nil {
			return nil, fmt.Errorf("header length: want 4 bytes, got %d: %w", n, err)
		}
		hlen = int64(binary.LittleEndian.Uint32(l[:]))
	default:
		return nil, fmt.Errorf("unknown format version %d.%d (kiln reads 1.0, 2.0 and 3.0)", major, minor)
	}
	if hlen > maxNPYHeader {
		return nil, fmt.Errorf("header length %d is over the limit of %d bytes", hlen, maxNPYHeader)
	}
	hdr := make([]byte, hlen)
	if n, err := io.ReadFull(r, hdr); err != nil {
		return nil, fmt.Errorf("header cut short: want %d bytes, got %d", hlen, n)
	}
	h, err := parseNPYHeader(hdr)
	if err != nil {
		return nil, err
	}
	if h.fortran {
		return nil, errors.New("fortran_order is True: Fortran (column-major) order is not supported; save a C-order array (np.ascontiguousarray)")
	}
	nbytes, err := dataBytes(h.shape, h.dtype)
	if err != nil {
		return nil, err
	}
	var a *NDArray
	if left, ok, err := remaining(r); err != nil {
		return nil, err
	} else if ok {
		// The length of what is left is known: check before allocating.
		if left < nbytes {
			return nil, fmt.Errorf("data cut short: shape %s %s needs %d bytes, %d remain", h.shape, h.dtype, nbytes, left)
		}
		a, err = Empty(h.shape, h.dtype, devices.CPUDevice)
		if err != nil {
			return nil, err
		}
		if n, err := io.ReadFull(r, a.hostData()); err != nil {
			_ = a.Release()
			return nil, fmt.Errorf("data cut short: shape %s %s needs %d bytes, got %d", h.shape, h.dtype, nbytes, n)
		}
	} else {
		// A stream: read in chunks, so the buffer grows with the data
		// that is really there, not with what the header claims.
		var buf bytes.Buffer
		buf.Grow(int(min(nbytes, streamChunk)))
		n, err := io.CopyN(&buf, r, nbytes)
		if err != nil && !errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("data: %w", err)
		}
		if n < nbytes {
			return nil, fmt.Errorf("data cut short: shape %s %s needs %d bytes, got %d", h.shape, h.dtype, nbytes, n)
		}
		a, err = FromBytes(buf.Bytes(), h.shape, h.dtype, devices.CPUDevice)
		if err != nil {
			return nil, err
		}
	}
	data := a.hostData()
	if h.swap {
		swapBytes(data, int(h.dtype.Bits/8))
	}
	if h.dtype.Code == Bool {
		normalizeBools(data)
	}
	return a, nil
}

// hostData is the storage of a freshly allocated compact CPU array.
func (a *NDArray) hostData() []byte {
	return a.Data().HostBytes(a.NumBytes())
}

// dataBytes is the byte size of a compact array, checked for overflow.
func dataBytes(shape Shape, dt DType) (int64, error) {
	if len(shape) > maxNDim {
		return 0, fmt.Errorf("shape has %d dimensions, more than %d", len(shape), maxNDim)
	}
	if err := shape.Validate(); err != nil {
		return 0, err
	}
	n, size := shape.NumElements(), int64(dt.Size())
	if size != 0 && n > math.MaxInt64/size {
		return 0, fmt.Errorf("shape %s of %s is more than %d bytes", shape, dt, int64(math.MaxInt64))
	}
	return n * size, nil
}

// remaining reports how many bytes are left in r when r can tell without
// being read: a bytes or strings reader, or a seekable file.
func remaining(r io.Reader) (int64, bool, error) {
	switch v := r.(type) {
	case interface{ Len() int }:
		return int64(v.Len()), true, nil
	case io.Seeker:
		cur, err := v.Seek(0, io.SeekCurrent)
		if err != nil {
			return 0, false, nil // a pipe or a terminal: read it as a stream
		}
		end, err := v.Seek(0, io.SeekEnd)
		if err != nil {
			return 0, false, nil
		}
		if _, err := v.Seek(cur, io.SeekStart); err != nil {
			return 0, false, fmt.Errorf("seek back to the data: %w", err)
		}
		return max(end-cur, 0), true, nil
	}
	return 0, false, nil
}

func swapBytes(b []byte, size int) {
	switch size {
	case 2:
		for i := 0; i+1 < len(b); i += 2 {
			b[i], b[i+1] = b[i+1], b[i]
		}
	case 4:
		for i := 0; i+3 < len(b); i += 4 {
			binary.LittleEndian.PutUint32(b[i:], binary.BigEndian.Uint32(b[i:]))
		}
	case 8:
		for i := 0; i+7 < len(b); i += 8 {
			binary.LittleEndian.PutUint64(b[i:], binary.BigEndian.Uint64(b[i:]))
		}
	}
}

func normalizeBools(b []byte) {
	for i, v := range b {
		if v > 1 {
			b[i] = 1
		}
	}
}

// parseNPYHeader reads the header dict. Like np.load, it wants exactly the
// keys descr, fortran_order and shape.
func parseNPYHeader(hdr []byte) (npyHeader, error) {
	p := &pyParser{s: hdr}
	v, err := p.parse()
	if err != nil {
		return npyHeader{}, fmt.Errorf("malformed header %q: %w", clip(hdr), err)
	}
	if v.kind != pyDict {
		return npyHeader{}, fmt.Errorf("malformed header %q: not a dict", clip(hdr))
	}
	var h npyHeader
	seen := map[string]bool{}
	for _, kv := range v.items {
		if kv.key.kind != pyStr {
			return npyHeader{}, fmt.Errorf("malformed header %q: key %s is not a string", clip(hdr), kv.key.text)
		}
		k := kv.key.text
		if seen[k] {
			return npyHeader{}, fmt.Errorf("malformed header %q: key %q appears twice", clip(hdr), k)
		}
		seen[k] = true
		switch k {
		case "descr":
			if kv.val.kind != pyStr {
				if kv.val.kind == pyList {
					return npyHeader{}, errors.New("descr is a list: structured dtypes are not supported")
				}
				return npyHeader{}, fmt.Errorf("descr %s is not a string", kv.val.text)
			}
			h.dtype, h.swap, err = parseDescr(kv.val.text)
			if err != nil {
				return npyHeader{}, err
			}
		case "fortran_order":
			if kv.val.kind != pyBool {
				return npyHeader{}, fmt.Errorf("fortran_order %s is not True or False", kv.val.text)
			}
			h.fortran = kv.val.text == "True"
		case "shape":
			if kv.val.kind != pyTuple {
				return npyHeader{}, fmt.Errorf("shape %s is not a tuple", kv.val.text)
			}
			if len(kv.val.items) > maxNDim {
				return npyHeader{}, fmt.Errorf("shape has %d dimensions, more than %d", len(kv.val.items), maxNDim)
			}
			h.shape = make(Shape, len(kv.val.items))
			for i, e := range kv.val.items {
				if e.val.kind != pyInt {
					return npyHeader{}, fmt.Errorf("shape: dimension %d is %s, not an integer", i, e.val.text)
				}
				d, err := strconv.ParseInt(e.val.text, 10, 64)
				if err != nil {
					return npyHeader{}, fmt.Errorf("shape: dimension %d is %s: out of range", i, e.val.text)
				}
				if d < 0 {
					return npyHeader{}, fmt.Errorf("shape: dimension %d is negative (%d)", i, d)
				}
				h.shape[i] = d
			}
		default:
			return npyHeader{}, fmt.Errorf("malformed header %q: unexpected key %q (want descr, fortran_order and shape)", clip(hdr), k)
		}
	}
	for _, k := range []string{"descr", "fortran_order", "shape"} {
		if !seen[k] {
			return npyHeader{}, fmt.Errorf("malformed header %q: no key %q", clip(hdr), k)
		}
	}
	return h, nil
}

// clip shortens a header for an error message.
func clip(b []byte) string {
	const n = 200
	s := strings.TrimRight(string(b), " \n")
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}

// parseDescr maps a numpy type string ('<f4', '|b1', '>i8', 'bfloat16') to
// a dtype, and reports whether the data is big-endian.
func parseDescr(s string) (DType, bool, error) {
	if s == "bfloat16" {
		return BFloat16, false, nil
	}
	body, order := s, byte('=')
	if body != "" && strings.IndexByte("<>|=", body[0]) >= 0 {
		order, body = body[0], body[1:]
	}
	if body == "" {
		return DType{}, false, fmt.Errorf("descr %q: no type", s)
	}
	kind, sizeStr := body[0], body[1:]
	if body == "?" {
		kind, sizeStr = 'b', "1"
	}
	size, err := strconv.Atoi(sizeStr)
	if sizeStr == "" || err != nil {
		size = -1
	}
	var dt DType
	switch {
	case kind == 'b' && size == 1:
		dt = BoolT
	case kind == 'i' && (size == 1 || size == 2 || size == 4 || size == 8):
		dt = DType{Int, uint8(size * 8), 1}
	case kind == 'u' && (size == 1 || size == 2 || size == 4 || size == 8):
		dt = DType{UInt, uint8(size * 8), 1}
	case kind == 'f' && (size == 2 || size == 4 || size == 8):
		dt = DType{Float, uint8(size * 8), 1}
	case kind == 'O':
		return DType{}, false, fmt.Errorf("descr %q: object arrays are not supported (they hold pickled Python objects)", s)
	case kind == 'V' && size == 2:
		return DType{}, false, fmt.Errorf("descr %q: void dtype with no element type (np.save writes ml_dtypes.bfloat16 this way; kiln writes and reads bfloat16 as descr 'bfloat16')", s)
	default:
		return DType{}, false, fmt.Errorf("descr %q: dtype not supported (kiln reads bool, int8-64, uint8-64, float16/32/64 and 'bfloat16')", s)
	}
	// '=' is the writer's native order; kiln runs only on little-endian
	// hosts and numpy never writes '=' in a file.
	return dt, order == '>' && size > 1, nil
}

// npyDescr is the numpy type string kiln writes for a scalar dtype.
func npyDescr(d DType) (string, error) {
	switch {
	case d.Code == Bool && d.Bits == 8:
		return "|b1", nil
	case d.Code == BFloat && d.Bits == 16:
		return "bfloat16", nil
	case (d.Code == Int || d.Code == UInt) && d.Bits == 8:
		return "|" + map[Code]string{Int: "i", UInt: "u"}[d.Code] + "1", nil
	case (d.Code == Int || d.Code == UInt) && (d.Bits == 16 || d.Bits == 32 || d.Bits == 64),
		d.Code == Float && (d.Bits == 16 || d.Bits == 32 || d.Bits == 64):
		return "<" + map[Code]string{Int: "i", UInt: "u", Float: "f"}[d.Code] + strconv.Itoa(int(d.Bits/8)), nil
	}
	return "", fmt.Errorf("dtype %s has no numpy equivalent", d)
}

// fileShape is the shape and scalar dtype an array is written with: vector
// lanes become a trailing dimension.
func fileShape(a *NDArray) (Shape, DType) {
	shape, dt := a.shape.Clone(), a.dtype
	if dt.Lanes > 1 {
		shape = append(shape, int64(dt.Lanes))
		dt = dt.Scalar()
	}
	return shape, dt
}

// npyHeaderBytes renders the magic, version, length and header exactly as
// np.save does (numpy 1.24 and later): version 1.0 unless the header does
// not fit its 2-byte length, then 2.0.
func npyHeaderBytes(descr string, shape Shape) []byte {
	var b strings.Builder
	b.WriteString("{'descr': '")
	b.WriteString(descr)
	b.WriteString("', 'fortran_order': False, 'shape': ")
	b.WriteString(pyTupleRepr(shape))
	b.WriteString(", }")
	if len(shape) > 0 {
		b.WriteString(strings.Repeat(" ", max(npyGrowthDigits-len(strconv.FormatInt(shape[0], 10)), 0)))
	}
	dict := b.String()
	hlen := len(dict) + 1 // the final '\n'
	for _, v := range []struct {
		major   byte
		lenSize int
	}{{1, 2}, {2, 4}} {
		pad := npyAlign - (len(npyMagic)+2+v.lenSize+hlen)%npyAlign
		total := hlen + pad
		if v.lenSize == 2 && total > math.MaxUint16 {
			continue
		}
		out := make([]byte, 0, len(npyMagic)+2+v.lenSize+total)
		out = append(out, npyMagic...)
		out = append(out, v.major, 0)
		if v.lenSize == 2 {
			out = binary.LittleEndian.AppendUint16(out, uint16(total))
		} else {
			out = binary.LittleEndian.AppendUint32(out, uint32(total))
		}
		out = append(out, dict...)
		out = append(out, bytes.Repeat([]byte{' '}, pad)...)
		return append(out, '\n')
	}
	panic("unreachable: a 2.0 header always fits")
}

// pyTupleRepr prints a shape as Python's repr of a tuple: (), (3,), (2, 3).
func pyTupleRepr(s Shape) string {
	parts := make([]string, len(s))
	for i, d := range s {
		parts[i] = strconv.FormatInt(d, 10)
	}
	if len(s) == 1 {
		return "(" + parts[0] + ",)"
	}
	return "(" + strings.Join(parts, ", ") + ")"
}

// WriteNPY writes a in .npy format: version 1.0 (2.0 when the header is
// too long for 1.0), little-endian, C order, with the header np.save would
// write. The array may live on any device and need not be contiguous.
// Vector dtypes are written with the lanes as a trailing dimension;
// bfloat16 with the descr 'bfloat16' (see the notes at the top of npy.go).
func WriteNPY(w io.Writer, a *NDArray) error {
	if err := writeNPY(w, a); err != nil {
		return fmt.Errorf("write npy: %w", err)
	}
	return nil
}

func writeNPY(w io.Writer, a *NDArray) error {
	if err := a.check(); err != nil {
		return err
	}
	shape, dt := fileShape(a)
	descr, err := npyDescr(dt)
	if err != nil {
		return err
	}
	data, err := compactHostBytes(a)
	if err != nil {
		return err
	}
	if _, err := w.Write(npyHeaderBytes(descr, shape)); err != nil {
		return err
	}
	if len(data) > 0 {
		if _, err := w.Write(data); err != nil {
			return err
		}
	}
	runtime.KeepAlive(a)
	return nil
}

// SaveNPY writes a to a .npy file. It writes a temporary file in the same
// directory and renames it over path, so path never holds half an array.
func SaveNPY(path string, a *NDArray) error {
	if err := writeFileAtomic(path, func(w io.Writer) error { return writeNPY(w, a) }); err != nil {
		return fmt.Errorf("save npy %q: %w", path, err)
	}
	return nil
}

// pyParser reads the subset of Python literals a .npy header uses: dicts,
// tuples, lists, strings, integers (with Python 2's L suffix), True, False
// and None.
type pyParser struct {
	s     []byte
	i     int
	depth int
}

type pyKind int

const (
	pyStr pyKind = iota
	pyInt
	pyBool
	pyNone
	pyTuple
	pyList
	pyDict
)

// pyValue is a parsed literal. text is the source text (the decoded string
// for pyStr); items hold a container's elements (val) or a dict's pairs.
type pyValue struct {
	kind  pyKind
	text  string
	items []pyItem
}

type pyItem struct{ key, val pyValue }

func (p *pyParser) parse() (pyValue, error) {
	v, err := p.value()
	if err != nil {
		return pyValue{}, err
	}
	p.space()
	if p.i != len(p.s) {
		return pyValue{}, fmt.Errorf("unexpected %q after the dict at byte %d", p.s[p.i], p.i)
	}
	return v, nil
}

func (p *pyParser) space() {
	for p.i < len(p.s) && (p.s[p.i] == ' ' || p.s[p.i] == '\n' || p.s[p.i] == '\t' || p.s[p.i] == '\r') {
		p.i++
	}
}

func (p *pyParser) value() (pyValue, error) {
	p.space()
	if p.i >= len(p.s) {
		return pyValue{}, errors.New("unexpected end")
	}
	start := p.i
	switch c := p.s[p.i]; {
	case c == '{' || c == '(' || c == '[':
		return p.container()
	case c == '\'' || c == '"':
		return p.str()
	case c == '-' || (c >= '0' && c <= '9'):
		p.i++
		for p.i < len(p.s) && p.s[p.i] >= '0' && p.s[p.i] <= '9' {
			p.i++
		}
		text := string(p.s[start:p.i])
		if text == "-" {
			return pyValue{}, fmt.Errorf("bad number at byte %d", start)
		}
		if p.i < len(p.s) && (p.s[p.i] == 'L' || p.s[p.i] == 'l') {
			p.i++ // Python 2 long
		}
		if p.i < len(p.s) && isIdent(p.s[p.i]) {
			return pyValue{}, fmt.Errorf("bad number at byte %d", start)
		}
		return pyValue{kind: pyInt, text: text}, nil
	case isIdent(c):
		for p.i < len(p.s) && isIdent(p.s[p.i]) {
			p.i++
		}
		switch w := string(p.s[start:p.i]); w {
		case "True", "False":
			return pyValue{kind: pyBool, text: w}, nil
		case "None":
			return pyValue{kind: pyNone, text: w}, nil
		default:
			return pyValue{}, fmt.Errorf("unexpected name %q at byte %d", w, start)
		}
	default:
		return pyValue{}, fmt.Errorf("unexpected %q at byte %d", c, start)
	}
}

func isIdent(c byte) bool {
	return c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')
}

func (p *pyParser) str() (pyValue, error) {
	q := p.s[p.i]
	start := p.i
	p.i++
	var b []byte
	for p.i < len(p.s) {
		c := p.s[p.i]
		switch {
		case c == q:
			p.i++
			return pyValue{kind: pyStr, text: string(b)}, nil
		case c == '\n':
			return pyValue{}, fmt.Errorf("string at byte %d not closed on its line", start)
		case c == '\\':
			if p.i+1 >= len(p.s) {
				return pyValue{}, fmt.Errorf("string at byte %d not closed", start)
			}
			switch e := p.s[p.i+1]; e {
			case '\\', '\'', '"':
				b = append(b, e)
			default:
				return pyValue{}, fmt.Errorf("unsupported escape \\%c in string at byte %d", e, start)
			}
			p.i += 2
		default:
			b = append(b, c)
			p.i++
		}
	}
	return pyValue{}, fmt.Errorf("string at byte %d not closed", start)
}

func (p *pyParser) container() (pyValue, error) {
	open := p.s[p.i]
	start := p.i
	p.i++
	p.depth++
	defer func() { p.depth-- }()
	if p.depth > 16 {
		return pyValue{}, fmt.Errorf("nested too deeply at byte %d", start)
	}
	var kind pyKind
	var closer byte
	switch open {
	case '{':
		kind, closer = pyDict, '}'
	case '(':
		kind, closer = pyTuple, ')'
	default:
		kind, closer = pyList, ']'
	}
	v := pyValue{kind: kind}
	sawComma := false
	for {
		p.space()
		if p.i >= len(p.s) {
			return pyValue{}, fmt.Errorf("%q at byte %d not closed", open, start)
		}
		if p.s[p.i] == closer {
			p.i++
			break
		}
		if len(v.items) > 0 && !sawComma {
			return pyValue{}, fmt.Errorf("want ',' or %q at byte %d, got %q", closer, p.i, p.s[p.i])
		}
		var it pyItem
		var err error
		if kind == pyDict {
			if it.key, err = p.value(); err != nil {
				return pyValue{}, err
			}
			p.space()
			if p.i >= len(p.s) || p.s[p.i] != ':' {
				return pyValue{}, fmt.Errorf("want ':' after a dict key at byte %d", p.i)
			}
			p.i++
		}
		if it.val, err = p.value(); err != nil {
			return pyValue{}, err
		}
		v.items = append(v.items, it)
		p.space()
		sawComma = p.i < len(p.s) && p.s[p.i] == ','
		if sawComma {
			p.i++
		}
	}
	// (3) is the integer 3 in Python, not a tuple.
	if kind == pyTuple && len(v.items) == 1 && !sawComma {
		return v.items[0].val, nil
	}
	v.text = string(p.s[start:p.i])
	return v, nil
}
