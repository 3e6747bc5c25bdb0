package vm

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"math"
	"os"

	"github.com/kiln-ml/kiln/ndarray"
)

// The vm.bin format:
//
//	magic    8 bytes  "KILNVM\x00\x1a"
//	version  uint16   little-endian (FormatVersion)
//	flags    uint16   flagSources when a funcref carries sources, else 0
//	length   uint32   bytes of body
//	body              constants, function table, functions (below)
//	crc      uint32   CRC-32 (IEEE) of everything before it
//
// Integers in the body are varints (zigzag for signed values) unless said
// otherwise; strings are a uvarint length and the bytes.
//
//	body      = count constant* count funcref* count function*
//	constant  = kind:byte payload (int: varint; float: 8 bytes LE;
//	            string; dtype: code bits lanes:uint16; shape: count varint*;
//	            tensor: dtype shape count bytes)
//	funcref   = kind:byte name (count (name op)*, when flags has
//	            flagSources: the model operators of a kernel)
//	function  = name count param* numregs:uvarint count instr*
//	param     = name kind:byte dtype ndim:varint hasshape:byte
//	            (tag:byte (0 varint | 1 name))*
//	instr     = op:byte (call: dst:varint func:uvarint count (kind:byte
//	            value:varint)*; ret: dst:varint; goto: target:uvarint;
//	            if: cond:varint target:uvarint)

// Magic starts every serialized executable.
const Magic = "KILNVM\x00\x1a"

// FormatVersion is the version of the vm.bin format this build writes and
// reads.
const FormatVersion = 1

const headerLen = len(Magic) + 2 + 2 + 4

// flagSources says the function table entries carry their sources.
const flagSources = 1

// Marshal serializes a valid executable into the vm.bin format.
func (e *Executable) Marshal() ([]byte, error) {
	if err := e.Validate(); err != nil {
		return nil, fmt.Errorf("vm: marshal executable: %w", err)
	}
	return e.encode()
}

// encode serializes without validating (tests use it to make well-formed
// files of invalid executables).
func (e *Executable) encode() ([]byte, error) {
	w := &writer{b: make([]byte, headerLen, 256)}
	w.uvarint(uint64(len(e.Constants)))
	for _, c := range e.Constants {
		w.byte(byte(c.Kind))
		switch c.Kind {
		case ConstInt:
			w.varint(c.Int)
		case ConstFloat:
			w.b = binary.LittleEndian.AppendUint64(w.b, math.Float64bits(c.Float))
		case ConstString:
			w.str(c.Str)
		case ConstDType:
			w.dtype(c.DType)
		case ConstShape:
			w.shape(c.Shape)
		case ConstTensor:
			w.dtype(c.DType)
			w.shape(c.Shape)
			w.uvarint(uint64(len(c.Data)))
			w.b = append(w.b, c.Data...)
		}
	}
	var flags uint16
	for _, r := range e.FuncTable {
		if len(r.Sources) > 0 {
			flags |= flagSources
		}
	}
	w.uvarint(uint64(len(e.FuncTable)))
	for _, r := range e.FuncTable {
		w.byte(byte(r.Kind))
		w.str(r.Name)
		if flags&flagSources != 0 {
			w.uvarint(uint64(len(r.Sources)))
			for _, s := range r.Sources {
				w.str(s.Name)
				w.str(s.Op)
			}
		}
	}
	w.uvarint(uint64(len(e.Functions)))
	for _, f := range e.Functions {
		w.str(f.Name)
		w.uvarint(uint64(len(f.Params)))
		for _, p := range f.Params {
			w.str(p.Name)
			w.byte(byte(p.Kind))
			w.dtype(p.DType)
			w.varint(int64(p.NDim))
			if p.Shape == nil {
				w.byte(0)
			} else {
				w.byte(1)
				for _, d := range p.Shape {
					if d.Name == "" {
						w.byte(0)
						w.varint(d.Value)
					} else {
						w.byte(1)
						w.str(d.Name)
					}
				}
			}
		}
		w.uvarint(uint64(f.NumRegs))
		w.uvarint(uint64(len(f.Code)))
		for _, in := range f.Code {
			w.byte(byte(in.Op))
			switch in.Op {
			case OpCall:
				w.varint(int64(in.Dst))
				w.uvarint(uint64(in.Func))
				w.uvarint(uint64(len(in.Args)))
				for _, a := range in.Args {
					w.byte(byte(a.Kind))
					w.varint(a.Value)
				}
			case OpRet:
				w.varint(int64(in.Dst))
			case OpGoto:
				w.uvarint(uint64(in.Target))
			case OpIf:
				w.varint(int64(in.Dst))
				w.uvarint(uint64(in.Target))
			}
		}
	}
	body := len(w.b) - headerLen
	if body > math.MaxUint32 {
		return nil, fmt.Errorf("vm: marshal executable: body of %d bytes is too large", body)
	}
	copy(w.b, Magic)
	binary.LittleEndian.PutUint16(w.b[len(Magic):], FormatVersion)
	binary.LittleEndian.PutUint16(w.b[len(Magic)+2:], flags)
	binary.LittleEndian.PutUint32(w.b[len(Magic)+4:], uint32(body))
	w.b = binary.LittleEndian.AppendUint32(w.b, crc32.ChecksumIEEE(w.b))
	return w.b, nil
}

type writer struct{ b []byte }

func (w *writer) byte(c byte)      { w.b = append(w.b, c) }
func (w *writer) uvarint(v uint64) { w.b = binary.AppendUvarint(w.b, v) }
func (w *writer) varint(v int64)   { w.b = binary.AppendVarint(w.b, v) }
func (w *writer) str(s string)     { w.uvarint(uint64(len(s))); w.b = append(w.b, s...) }
func (w *writer) dtype(d ndarray.DType) {
	w.b = append(w.b, byte(d.Code), d.Bits)
	w.b = binary.LittleEndian.AppendUint16(w.b, d.Lanes)
}
func (w *writer) shape(s ndarray.Shape) {
	w.uvarint(uint64(len(s)))
	for _, d := range s {
		w.varint(d)
	}
}

// Unmarshal decodes and validates a serialized executable. A truncated,
// corrupt or hostile input gives an error wrapping ErrInvalid that says
// what was wrong and where; it never panics.
func Unmarshal(b []byte) (*Executable, error) {
	if len(b) < headerLen+4 {
		return nil, fmt.Errorf("vm: unmarshal executable: %w: %d bytes is shorter than the %d-byte header and checksum", ErrInvalid, len(b), headerLen+4)
	}
	if string(b[:len(Magic)]) != Magic {
		return nil, fmt.Errorf("vm: unmarshal executable: %w: bad magic %q (not a kiln VM executable)", ErrInvalid, b[:len(Magic)])
	}
	if v := binary.LittleEndian.Uint16(b[len(Magic):]); v != FormatVersion {
		return nil, fmt.Errorf("vm: unmarshal executable: %w: format version %d, this kiln reads %d", ErrInvalid, v, FormatVersion)
	}
	fl := binary.LittleEndian.Uint16(b[len(Magic)+2:])
	if fl&^flagSources != 0 {
		return nil, fmt.Errorf("vm: unmarshal executable: %w: unknown flags %#x", ErrInvalid, fl)
	}
	n := int64(binary.LittleEndian.Uint32(b[len(Magic)+4:]))
	if have := int64(len(b) - headerLen - 4); n != have {
		if n > have {
			return nil, fmt.Errorf("vm: unmarshal executable: %w: truncated: header says %d body bytes, %d present", ErrInvalid, n, have)
		}
		return nil, fmt.Errorf("vm: unmarshal executable: %w: %d bytes after the body's %d and the checksum", ErrInvalid, have-n, n)
	}
	end := len(b) - 4
	if want, got := binary.LittleEndian.Uint32(b[end:]), crc32.ChecksumIEEE(b[:end]); want != got {
		return nil, fmt.Errorf("vm: unmarshal executable: %w: checksum mismatch (stored %08x, computed %08x): the file is corrupt", ErrInvalid, want, got)
	}
	e, err := decodeBody(b[headerLen:end], fl)
	if err != nil {
		return nil, fmt.Errorf("vm: unmarshal executable: %w", err)
	}
	return e, nil
}

// decodeBody decodes and validates the body (no header, no checksum).
func decodeBody(body []byte, flags uint16) (*Executable, error) {
	r := &reader{b: body, flags: flags}
	e := r.executable()
	if r.err != nil {
		return nil, r.err
	}
	if r.off != len(r.b) {
		return nil, fmt.Errorf("%w: %d bytes left over after the last function", ErrInvalid, len(r.b)-r.off)
	}
	if err := e.Validate(); err != nil {
		return nil, err
	}
	return e, nil
}

// reader decodes with a sticky error that names the item being read.
type reader struct {
	b     []byte
	off   int
	ctx   string
	err   error
	flags uint16
}

func (r *reader) fail(format string, a ...any) {
	if r.err == nil {
		r.err = fmt.Errorf("%w: %s: "+format, append([]any{ErrInvalid, r.ctx}, a...)...)
	}
}

func (r *reader) left() int { return len(r.b) - r.off }

func (r *reader) bytes(n int, what string) []byte {
	if r.err != nil {
		return nil
	}
	if n < 0 || n > r.left() {
		r.fail("truncated reading %s at byte %d: want %d bytes, %d left", what, r.off, n, r.left())
		return nil
	}
	out := r.b[r.off : r.off+n]
	r.off += n
	return out
}

func (r *reader) byte(what string) byte {
	b := r.bytes(1, what)
	if b == nil {
		return 0
	}
	return b[0]
}

func (r *reader) uvarint(what string) uint64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.b[r.off:])
	if n <= 0 {
		if n == 0 {
			r.fail("truncated reading %s at byte %d", what, r.off)
		} else {
			r.fail("%s at byte %d: varint overflows 64 bits", what, r.off)
		}
		return 0
	}
	r.off += n
	return v
}

func (r *reader) varint(what string) int64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Varint(r.b[r.off:])
	if n <= 0 {
		if n == 0 {
			r.fail("truncated reading %s at byte %d", what, r.off)
		} else {
			r.fail("%s at byte %d: varint overflows 64 bits", what, r.off)
		}
		return 0
	}
	r.off += n
	return v
}

// count reads an element count; each element takes at least one byte, so
// a count larger than what is left is corrupt (and must not be allocated).
func (r *reader) count(what string) int {
	v := r.uvarint(what)
	if r.err != nil {
		return 0
	}
	if v > uint64(r.left()) {
		r.fail("truncated: %s is %d but only %d bytes are left", what, v, r.left())
		return 0
	}
	return int(v)
}

func (r *reader) int32v(what string) int32 {
	v := r.varint(what)
	if v < math.MinInt32 || v > math.MaxInt32 {
		r.fail("%s %d out of range", what, v)
		return 0
	}
	return int32(v)
}

func (r *reader) uint32v(what string) int32 {
	v := r.uvarint(what)
	if v > math.MaxInt32 {
		r.fail("%s %d out of range", what, v)
		return 0
	}
	return int32(v)
}

func (r *reader) str(what string) string {
	n := r.count(what + " length")
	return string(r.bytes(n, what))
}

func (r *reader) dtype(what string) ndarray.DType {
	b := r.bytes(4, what)
	if b == nil {
		return ndarray.DType{}
	}
	return ndarray.DType{Code: ndarray.Code(b[0]), Bits: b[1], Lanes: binary.LittleEndian.Uint16(b[2:])}
}

func (r *reader) shape(what string) ndarray.Shape {
	n := r.count(what + " rank")
	if r.err != nil {
		return nil
	}
	s := make(ndarray.Shape, n)
	for i := range s {
		s[i] = r.varint(what)
	}
	return s
}

func (r *reader) executable() *Executable {
	e := &Executable{}
	r.ctx = "constants"
	nc := r.count("constant count")
	e.Constants = make([]Constant, 0, nc)
	for i := 0; i < nc && r.err == nil; i++ {
		r.ctx = fmt.Sprintf("constant %d", i)
		c := Constant{Kind: ConstKind(r.byte("kind"))}
		switch c.Kind {
		case ConstNil:
		case ConstInt:
			c.Int = r.varint("int")
		case ConstFloat:
			if b := r.bytes(8, "float"); b != nil {
				c.Float = math.Float64frombits(binary.LittleEndian.Uint64(b))
			}
		case ConstString:
			c.Str = r.str("string")
		case ConstDType:
			c.DType = r.dtype("dtype")
		case ConstShape:
			c.Shape = r.shape("shape")
		case ConstTensor:
			c.DType = r.dtype("tensor dtype")
			c.Shape = r.shape("tensor shape")
			n := r.count("tensor data length")
			if b := r.bytes(n, "tensor data"); b != nil {
				c.Data = make([]byte, n)
				copy(c.Data, b)
			}
		default:
			r.fail("unknown constant kind %d", c.Kind)
		}
		e.Constants = append(e.Constants, c)
	}
	r.ctx = "function table"
	nt := r.count("function table size")
	e.FuncTable = make([]FuncRef, 0, nt)
	for i := 0; i < nt && r.err == nil; i++ {
		r.ctx = fmt.Sprintf("function table entry %d", i)
		k := FuncKind(r.byte("kind"))
		ref := FuncRef{Kind: k, Name: r.str("name")}
		if r.flags&flagSources != 0 {
			ns := r.count("source count")
			for j := 0; j < ns && r.err == nil; j++ {
				ref.Sources = append(ref.Sources, Source{Name: r.str("source name"), Op: r.str("source op")})
			}
		}
		e.FuncTable = append(e.FuncTable, ref)
	}
	r.ctx = "functions"
	nf := r.count("function count")
	e.Functions = make([]Function, 0, nf)
	for i := 0; i < nf && r.err == nil; i++ {
		r.ctx = fmt.Sprintf("function %d", i)
		e.Functions = append(e.Functions, r.function())
	}
	return e
}

func (r *reader) function() Function {
	f := Function{Name: r.str("name")}
	if f.Name != "" {
		r.ctx = fmt.Sprintf("function %q", f.Name)
	}
	base := r.ctx
	np := r.count("parameter count")
	f.Params = make([]Param, 0, np)
	for i := 0; i < np && r.err == nil; i++ {
		r.ctx = fmt.Sprintf("%s parameter %d", base, i)
		p := Param{Name: r.str("name"), Kind: ParamKind(r.byte("kind")), DType: r.dtype("dtype")}
		nd := r.varint("rank")
		if nd < -1 || nd > int64(r.left()) {
			r.fail("rank %d out of range", nd)
		}
		p.NDim = int(nd)
		if r.byte("shape flag") == 1 && r.err == nil {
			if p.NDim < 0 {
				r.fail("a shape needs a known rank")
			}
			p.Shape = make([]Dim, 0, max(p.NDim, 0))
			for j := 0; j < p.NDim && r.err == nil; j++ {
				switch r.byte("dimension tag") {
				case 0:
					p.Shape = append(p.Shape, Dim{Value: r.varint("dimension")})
				case 1:
					name := r.str("dimension name")
					if name == "" {
						r.fail("dimension %d: empty name", j)
					}
					p.Shape = append(p.Shape, Dim{Name: name})
				default:
					r.fail("dimension %d: bad tag", j)
				}
			}
		}
		f.Params = append(f.Params, p)
	}
	r.ctx = base
	nr := r.uvarint("register count")
	if nr > MaxRegs {
		r.fail("%d registers (at most %d)", nr, MaxRegs)
	}
	f.NumRegs = int(nr)
	ni := r.count("instruction count")
	f.Code = make([]Instr, 0, ni)
	for pc := 0; pc < ni && r.err == nil; pc++ {
		r.ctx = fmt.Sprintf("%s instruction %d", base, pc)
		in := Instr{Op: Opcode(r.byte("opcode"))}
		switch in.Op {
		case OpCall:
			in.Dst = Reg(r.int32v("destination"))
			in.Func = r.uint32v("function index")
			na := r.count("argument count")
			if na > MaxArgs {
				r.fail("%d arguments (at most %d)", na, MaxArgs)
				break
			}
			in.Args = make([]Arg, 0, na)
			for j := 0; j < na && r.err == nil; j++ {
				k := ArgKind(r.byte("argument kind"))
				in.Args = append(in.Args, Arg{Kind: k, Value: r.varint("argument")})
			}
		case OpRet:
			in.Dst = Reg(r.int32v("returned register"))
		case OpGoto:
			in.Target = r.uint32v("target")
		case OpIf:
			in.Dst = Reg(r.int32v("condition register"))
			in.Target = r.uint32v("target")
		default:
			r.fail("unknown opcode %d", in.Op)
		}
		f.Code = append(f.Code, in)
	}
	return f
}

// Save writes the serialized executable to a file.
func (e *Executable) Save(path string) error {
	b, err := e.Marshal()
	if err != nil {
		return err
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		return fmt.Errorf("vm: save executable: %w", err)
	}
	return nil
}

// Load reads a serialized executable from a file.
func Load(path string) (*Executable, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("vm: load executable: %w", err)
	}
	e, err := Unmarshal(b)
	if err != nil {
		return nil, fmt.Errorf("%w (file %s)", err, path)
	}
	return e, nil
}
