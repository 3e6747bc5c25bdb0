package ndarray

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"runtime"
	"sort"
	"strings"
	"unicode/utf8"

	"github.com/kiln-ml/kiln/devices"
)

// The safetensors format (huggingface/safetensors): an 8-byte little-endian
// header length N, N bytes of JSON
//
//	{"__metadata__": {"key": "value"}, "name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]}}
//
// then the byte buffer the offsets index, little-endian, C order. kiln
// follows the reference implementation: the header is at most 100,000,000
// bytes and starts with '{'; the tensors must cover the buffer exactly,
// with no overlap and no hole; the writer pads the header with spaces to a
// multiple of 8 bytes and lays tensors out by descending dtype rank, then
// by name, so every tensor starts at a multiple of its element size.
// Vector dtypes are written with the lanes as a trailing dimension, as in
// WriteNPY.

// maxSafetensorsHeader is the reference implementation's MAX_HEADER_SIZE.
const maxSafetensorsHeader = 100_000_000

// stMetadataKey is the header key that holds the string metadata.
const stMetadataKey = "__metadata__"

// stDTypes lists the safetensors dtype names kiln reads and writes, in the
// reference implementation's order (its Dtype enum, by increasing
// alignment); the writer sorts tensors by descending position here.
var stDTypes = []struct {
	name  string
	dtype DType
}{
	{"BOOL", BoolT},
	{"U8", Uint8},
	{"I8", Int8},
	{"I16", Int16},
	{"U16", Uint16},
	{"F16", Float16},
	{"BF16", BFloat16},
	{"I32", Int32},
	{"U32", Uint32},
	{"F32", Float32},
	{"F64", Float64},
	{"I64", Int64},
	{"U64", Uint64},
}

func stDTypeByName(name string) (DType, bool) {
	for _, d := range stDTypes {
		if d.name == name {
			return d.dtype, true
		}
	}
	return DType{}, false
}

// stName returns the safetensors name of a scalar dtype and its rank in
// stDTypes.
func stName(dt DType) (string, int, bool) {
	for i, d := range stDTypes {
		if d.dtype == dt {
			return d.name, i, true
		}
	}
	return "", 0, false
}

func stNames() string {
	names := make([]string, len(stDTypes))
	for i, d := range stDTypes {
		names[i] = d.name
	}
	return strings.Join(names, ", ")
}

// stEntry is one tensor as the header describes it.
type stEntry struct {
	name       string
	dtype      DType
	shape      Shape
	begin, end int64
}

// ReadSafetensors reads a safetensors file of size bytes from r onto the
// CPU. It returns the tensors by name and the "__metadata__" strings (an
// empty map when the file has none). Every check the reference
// implementation makes is made before any tensor is allocated, so a
// header that lies costs no memory. The CPU backend (devices/cpu) must be
// registered.
func ReadSafetensors(r io.ReaderAt, size int64) (map[string]*NDArray, map[string]string, error) {
	tensors, meta, err := readSafetensors(r, size)
	if err != nil {
		return nil, nil, fmt.Errorf("read safetensors: %w", err)
	}
	return tensors, meta, nil
}

// LoadSafetensors reads a safetensors file onto the CPU.
func LoadSafetensors(path string) (map[string]*NDArray, map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, fmt.Errorf("load safetensors: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, nil, fmt.Errorf("load safetensors: %w", err)
	}
	tensors, meta, err := readSafetensors(f, st.Size())
	if err != nil {
		return nil, nil, fmt.Errorf("load safetensors %q: %w", path, err)
	}
	return tensors, meta, nil
}

func readSafetensors(r io.ReaderAt, size int64) (map[string]*NDArray, map[string]string, error) {
	if size < 8 {
		return nil, nil, fmt.Errorf("file is %d bytes, too short for the 8-byte header length", size)
	}
	var lenBuf [8]byte
	if n, err := r.ReadAt(lenBuf[:], 0); n < 8 {
		return nil, nil, fmt.Errorf("header length: want 8 bytes, got %d: %w", n, err)
	}
	hlen := binary.LittleEndian.Uint64(lenBuf[:])
	if hlen > maxSafetensorsHeader {
		return nil, nil, fmt.Errorf("header length %d is over the limit of %d bytes", hlen, maxSafetensorsHeader)
	}
	if hlen > uint64(size-8) {
		return nil, nil, fmt.Errorf("header length %d runs past the end of the file (%d bytes follow the length)", hlen, size-8)
	}
	hdr := make([]byte, hlen)
	if n, err := r.ReadAt(hdr, 8); n < len(hdr) {
		return nil, nil, fmt.Errorf("header cut short: want %d bytes, got %d: %w", hlen, n, err)
	}
	entries, meta, err := parseSafetensorsHeader(hdr)
	if err != nil {
		return nil, nil, err
	}
	bufStart := 8 + int64(hlen)
	bufLen := size - bufStart
	if err := checkCoverage(entries, bufLen); err != nil {
		return nil, nil, err
	}
	tensors := make(map[string]*NDArray, len(entries))
	fail := func(err error) (map[string]*NDArray, map[string]string, error) {
		for _, a := range tensors {
			_ = a.Release()
		}
		return nil, nil, err
	}
	for _, e := range entries {
		a, err := Empty(e.shape, e.dtype, devices.CPUDevice)
		if err != nil {
			return fail(fmt.Errorf("tensor %q: %w", e.name, err))
		}
		tensors[e.name] = a
		data := a.hostData()
		if n, err := r.ReadAt(data, bufStart+e.begin); n < len(data) {
			return fail(fmt.Errorf("tensor %q: data cut short: want %d bytes at offset %d, got %d: %w", e.name, len(data), bufStart+e.begin, n, err))
		}
		if e.dtype.Code == Bool {
			normalizeBools(data)
		}
	}
	return tensors, meta, nil
}

// parseSafetensorsHeader decodes the JSON header. It refuses what the
// reference refuses (invalid UTF-8, a first byte other than '{', trailing
// garbage, unknown dtypes, missing fields) and, unlike a plain JSON
// decoder, duplicate names.
func parseSafetensorsHeader(hdr []byte) ([]stEntry, map[string]string, error) {
	if !utf8.Valid(hdr) {
		return nil, nil, errors.New("header is not valid UTF-8")
	}
	if len(hdr) == 0 || hdr[0] != '{' {
		return nil, nil, fmt.Errorf("header %q does not start with '{'", clip(hdr))
	}
	dec := json.NewDecoder(bytes.NewReader(hdr))
	notJSON := func(err error) error { return fmt.Errorf("header is not JSON: %w", err) }
	if _, err := dec.Token(); err != nil { // the '{' checked above
		return nil, nil, notJSON(err)
	}
	meta := map[string]string{}
	seen := map[string]bool{}
	var entries []stEntry
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, nil, notJSON(err)
		}
		name, ok := tok.(string)
		if !ok {
			return nil, nil, notJSON(fmt.Errorf("key %v is not a string", tok))
		}
		if seen[name] {
			return nil, nil, fmt.Errorf("tensor %q appears twice in the header", name)
		}
		seen[name] = true
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, nil, notJSON(err)
		}
		if name == stMetadataKey {
			var m map[string]string
			if err := json.Unmarshal(raw, &m); err != nil {
				return nil, nil, fmt.Errorf("%s is not an object of strings: %w", stMetadataKey, err)
			}
			for k, v := range m {
				meta[k] = v
			}
			continue
		}
		e, err := parseSTEntry(name, raw)
		if err != nil {
			return nil, nil, err
		}
		entries = append(entries, e)
	}
	if _, err := dec.Token(); err != nil { // the closing '}'
		return nil, nil, notJSON(err)
	}
	if tok, err := dec.Token(); err != io.EOF {
		if err != nil {
			return nil, nil, notJSON(err)
		}
		return nil, nil, notJSON(fmt.Errorf("%v after the closing '}'", tok))
	}
	return entries, meta, nil
}

func parseSTEntry(name string, raw json.RawMessage) (stEntry, error) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil || fields == nil {
		return stEntry{}, fmt.Errorf("tensor %q: want an object with dtype, shape and data_offsets, got %s", name, clip(raw))
	}
	for _, k := range []string{"dtype", "shape", "data_offsets"} {
		if v, ok := fields[k]; !ok || string(v) == "null" {
			return stEntry{}, fmt.Errorf("tensor %q: no %s", name, k)
		}
	}
	e := stEntry{name: name}
	var dtName string
	if err := json.Unmarshal(fields["dtype"], &dtName); err != nil {
		return stEntry{}, fmt.Errorf("tensor %q: dtype %s is not a string", name, clip(fields["dtype"]))
	}
	dt, ok := stDTypeByName(dtName)
	if !ok {
		return stEntry{}, fmt.Errorf("tensor %q: unknown dtype %q (kiln reads %s)", name, dtName, stNames())
	}
	e.dtype = dt
	var shape []uint64
	if err := json.Unmarshal(fields["shape"], &shape); err != nil {
		return stEntry{}, fmt.Errorf("tensor %q: shape %s is not a list of non-negative integers", name, clip(fields["shape"]))
	}
	if len(shape) > maxNDim {
		return stEntry{}, fmt.Errorf("tensor %q: shape has %d dimensions, more than %d", name, len(shape), maxNDim)
	}
	e.shape = make(Shape, len(shape))
	for i, d := range shape {
		if d > math.MaxInt64 {
			return stEntry{}, fmt.Errorf("tensor %q: shape dimension %d is %d, out of range", name, i, d)
		}
		e.shape[i] = int64(d)
	}
	var off []uint64
	if err := json.Unmarshal(fields["data_offsets"], &off); err != nil || len(off) != 2 {
		return stEntry{}, fmt.Errorf("tensor %q: data_offsets %s is not [begin, end]", name, clip(fields["data_offsets"]))
	}
	if off[0] > off[1] {
		return stEntry{}, fmt.Errorf("tensor %q: data_offsets [%d, %d] begin past their end", name, off[0], off[1])
	}
	if off[1] > math.MaxInt64 {
		return stEntry{}, fmt.Errorf("tensor %q: data_offsets [%d, %d] out of range", name, off[0], off[1])
	}
	e.begin, e.end = int64(off[0]), int64(off[1])
	nbytes, err := dataBytes(e.shape, e.dtype)
	if err != nil {
		return stEntry{}, fmt.Errorf("tensor %q: %w", name, err)
	}
	if e.end-e.begin != nbytes {
		return stEntry{}, fmt.Errorf("tensor %q: data_offsets [%d, %d] hold %d bytes, shape %s of %s needs %d", name, e.begin, e.end, e.end-e.begin, e.shape, e.dtype, nbytes)
	}
	return e, nil
}

// checkCoverage checks that the tensors tile the buffer exactly: sorted by
// offsets, each begins where the one before ends, and the last ends at the
// end of the buffer.
func checkCoverage(entries []stEntry, bufLen int64) error {
	for _, e := range entries {
		if e.end > bufLen {
			return fmt.Errorf("tensor %q: data_offsets [%d, %d] run past the end of the %d-byte buffer", e.name, e.begin, e.end, bufLen)
		}
	}
	sorted := append([]stEntry(nil), entries...)
	sort.SliceStable(sorted, func(i, j int) bool {
		if sorted[i].begin != sorted[j].begin {
			return sorted[i].begin < sorted[j].begin
		}
		return sorted[i].end < sorted[j].end
	})
	at := int64(0)
	prev := ""
	for _, e := range sorted {
		switch {
		case e.begin < at:
			return fmt.Errorf("tensor %q: data_offsets [%d, %d] overlap tensor %q, which ends at %d", e.name, e.begin, e.end, prev, at)
		case e.begin > at:
			return fmt.Errorf("hole in the buffer: bytes [%d, %d) before tensor %q belong to no tensor", at, e.begin, e.name)
		}
		at, prev = e.end, e.name
	}
	if at != bufLen {
		return fmt.Errorf("hole in the buffer: bytes [%d, %d) at its end belong to no tensor", at, bufLen)
	}
	return nil
}

// WriteSafetensors writes tensors and metadata in safetensors format, laid
// out as the reference implementation lays them out: tensors by
// descending dtype rank, then by name, the header padded with spaces to a
// multiple of 8 bytes. Arrays may live on any device and need not be
// contiguous; vector dtypes are written with the lanes as a trailing
// dimension. The name "__metadata__" is reserved.
func WriteSafetensors(w io.Writer, tensors map[string]*NDArray, metadata map[string]string) error {
	if err := writeSafetensors(w, tensors, metadata); err != nil {
		return fmt.Errorf("write safetensors: %w", err)
	}
	return nil
}

// SaveSafetensors writes a safetensors file. It writes a temporary file in
// the same directory and renames it over path, so path never holds half a
// file.
func SaveSafetensors(path string, tensors map[string]*NDArray, metadata map[string]string) error {
	err := writeFileAtomic(path, func(w io.Writer) error { return writeSafetensors(w, tensors, metadata) })
	if err != nil {
		return fmt.Errorf("save safetensors %q: %w", path, err)
	}
	return nil
}

func writeSafetensors(w io.Writer, tensors map[string]*NDArray, metadata map[string]string) error {
	type out struct {
		name  string
		dt    string
		rank  int
		shape Shape
		a     *NDArray
		n     int64
	}
	outs := make([]out, 0, len(tensors))
	for name, a := range tensors {
		if name == stMetadataKey {
			return fmt.Errorf("tensor name %q is reserved for metadata", name)
		}
		if !utf8.ValidString(name) {
			return fmt.Errorf("tensor name %q is not valid UTF-8", name)
		}
		if a == nil {
			return fmt.Errorf("tensor %q is nil", name)
		}
		if err := a.check(); err != nil {
			return fmt.Errorf("tensor %q: %w", name, err)
		}
		shape, dt := fileShape(a)
		dtName, rank, ok := stName(dt)
		if !ok {
			return fmt.Errorf("tensor %q: dtype %s has no safetensors equivalent", name, a.dtype)
		}
		outs = append(outs, out{name: name, dt: dtName, rank: rank, shape: shape, a: a, n: a.NumBytes()})
	}
	sort.Slice(outs, func(i, j int) bool {
		if outs[i].rank != outs[j].rank {
			return outs[i].rank > outs[j].rank
		}
		return outs[i].name < outs[j].name
	})

	for k, v := range metadata {
		if !utf8.ValidString(k) || !utf8.ValidString(v) {
			return fmt.Errorf("metadata %q: %q is not valid UTF-8", k, v)
		}
	}

	var h bytes.Buffer
	h.WriteByte('{')
	if len(metadata) > 0 {
		keys := make([]string, 0, len(metadata))
		for k := range metadata {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		h.WriteString(`"` + stMetadataKey + `":{`)
		for i, k := range keys {
			if i > 0 {
				h.WriteByte(',')
			}
			writeJSONString(&h, k)
			h.WriteByte(':')
			writeJSONString(&h, metadata[k])
		}
		h.WriteByte('}')
	}
	off := int64(0)
	for i, o := range outs {
		if i > 0 || len(metadata) > 0 {
			h.WriteByte(',')
		}
		writeJSONString(&h, o.name)
		fmt.Fprintf(&h, `:{"dtype":%q,"shape":[`, o.dt)
		for j, d := range o.shape {
			if j > 0 {
				h.WriteByte(',')
			}
			fmt.Fprint(&h, d)
		}
		fmt.Fprintf(&h, `],"data_offsets":[%d,%d]}`, off, off+o.n)
		off += o.n
	}
	h.WriteByte('}')
	for h.Len()%8 != 0 {
		h.WriteByte(' ')
	}
	var lenBuf [8]byte
	binary.LittleEndian.PutUint64(lenBuf[:], uint64(h.Len()))
	if _, err := w.Write(lenBuf[:]); err != nil {
		return err
	}
	if _, err := w.Write(h.Bytes()); err != nil {
		return err
	}
	for _, o := range outs {
		data, err := compactHostBytes(o.a)
		if err != nil {
			return fmt.Errorf("tensor %q: %w", o.name, err)
		}
		if len(data) > 0 {
			if _, err := w.Write(data); err != nil {
				return err
			}
		}
		runtime.KeepAlive(o.a)
	}
	return nil
}

// writeJSONString writes s as a JSON string without HTML escaping, as the
// reference implementation's serializer does.
func writeJSONString(b *bytes.Buffer, s string) {
	enc := json.NewEncoder(b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(s)       // a string always encodes
	b.Truncate(b.Len() - 1) // Encode appends '\n'
}
