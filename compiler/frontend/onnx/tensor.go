package onnx

import (
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/kiln-ml/kiln/compiler/frontend/onnx/onnxpb"
	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/devices"
	"github.com/kiln-ml/kiln/ndarray"
)

// Tensor is a tensor held on the host: an initializer, the value of a
// Constant node or a value folded at import time. Data is compact,
// row-major and little-endian.
type Tensor struct {
	Name  string
	DType ir.DType
	Shape []int64
	Data  []byte
}

// NumElements is the product of the dims (1 for a scalar).
func (t *Tensor) NumElements() int64 { return numElements(t.Shape) }

func numElements(shape []int64) int64 {
	n := int64(1)
	for _, d := range shape {
		n *= d
	}
	return n
}

// dtypeOf maps an ONNX TensorProto.DataType to kiln's dtype.
func dtypeOf(t int32) (ir.DType, error) {
	switch onnxpb.TensorProto_DataType(t) {
	case onnxpb.TensorProto_FLOAT:
		return ir.Float32, nil
	case onnxpb.TensorProto_UINT8:
		return ir.Uint8, nil
	case onnxpb.TensorProto_INT8:
		return ir.Int8, nil
	case onnxpb.TensorProto_UINT16:
		return ndarray.Uint16, nil
	case onnxpb.TensorProto_INT16:
		return ir.Int16, nil
	case onnxpb.TensorProto_INT32:
		return ir.Int32, nil
	case onnxpb.TensorProto_INT64:
		return ir.Int64, nil
	case onnxpb.TensorProto_BOOL:
		return ir.Bool, nil
	case onnxpb.TensorProto_FLOAT16:
		return ir.Float16, nil
	case onnxpb.TensorProto_BFLOAT16:
		return ndarray.BFloat16, nil
	case onnxpb.TensorProto_DOUBLE:
		return ir.Float64, nil
	case onnxpb.TensorProto_UINT32:
		return ir.Uint32, nil
	case onnxpb.TensorProto_UINT64:
		return ir.Uint64, nil
	}
	name, ok := onnxpb.TensorProto_DataType_name[t]
	if !ok {
		name = strconv.Itoa(int(t))
	}
	return ir.Void, fmt.Errorf("%w: element type %s", ErrUnsupported, name)
}

// maxElements bounds a tensor's size (2^34 bytes of float32) so that dims
// read from a file cannot ask for absurd allocations.
const maxElements = 1 << 32

func checkDims(dims []int64) (int64, error) {
	n := int64(1)
	for _, d := range dims {
		if d < 0 {
			return 0, fmt.Errorf("negative dimension %d in %v", d, dims)
		}
		if d != 0 && n > maxElements/d {
			return 0, fmt.Errorf("dims %v hold more than %d elements", dims, int64(maxElements))
		}
		n *= d
	}
	return n, nil
}

// decodeTensor reads a TensorProto: raw_data, the typed fields or, for
// data_location EXTERNAL, a file under dir ("" refuses external data).
func decodeTensor(tp *onnxpb.TensorProto, dir string) (*Tensor, error) {
	name := tp.GetName()
	fail := func(err error) (*Tensor, error) { return nil, fmt.Errorf("tensor %q: %w", name, err) }
	if tp.Segment != nil {
		return fail(fmt.Errorf("%w: segmented tensors", ErrUnsupported))
	}
	dt, err := dtypeOf(tp.GetDataType())
	if err != nil {
		return fail(err)
	}
	n, err := checkDims(tp.GetDims())
	if err != nil {
		return fail(err)
	}
	t := &Tensor{Name: name, DType: dt, Shape: append([]int64{}, tp.GetDims()...)}
	size := n * int64(dt.Size())
	if tp.GetDataLocation() == onnxpb.TensorProto_EXTERNAL {
		if t.Data, err = readExternal(tp, dir, size); err != nil {
			return fail(err)
		}
		return t, nil
	}
	if raw := tp.GetRawData(); tp.RawData != nil {
		if int64(len(raw)) != size {
			return fail(fmt.Errorf("raw_data has %d bytes; dims %v of %s need %d", len(raw), t.Shape, dt, size))
		}
		t.Data = append([]byte{}, raw...)
		return t, nil
	}
	t.Data = make([]byte, size)
	count := func(field string, got int) error {
		if int64(got) != n {
			return fmt.Errorf("%s has %d values; dims %v need %d", field, got, t.Shape, n)
		}
		return nil
	}
	le := binary.LittleEndian
	switch onnxpb.TensorProto_DataType(tp.GetDataType()) {
	case onnxpb.TensorProto_FLOAT:
		if err := count("float_data", len(tp.FloatData)); err != nil {
			return fail(err)
		}
		for i, v := range tp.FloatData {
			le.PutUint32(t.Data[4*i:], math.Float32bits(v))
		}
	case onnxpb.TensorProto_DOUBLE:
		if err := count("double_data", len(tp.DoubleData)); err != nil {
			return fail(err)
		}
		for i, v := range tp.DoubleData {
			le.PutUint64(t.Data[8*i:], math.Float64bits(v))
		}
	case onnxpb.TensorProto_INT64:
		if err := count("int64_data", len(tp.Int64Data)); err != nil {
			return fail(err)
		}
		for i, v := range tp.Int64Data {
			le.PutUint64(t.Data[8*i:], uint64(v))
		}
	case onnxpb.TensorProto_UINT32, onnxpb.TensorProto_UINT64:
		if err := count("uint64_data", len(tp.Uint64Data)); err != nil {
			return fail(err)
		}
		for i, v := range tp.Uint64Data {
			putInt(t.Data, dt, i, int64(v))
		}
	default: // int32, int16, int8, uint16, uint8, bool, float16, bfloat16
		if err := count("int32_data", len(tp.Int32Data)); err != nil {
			return fail(err)
		}
		for i, v := range tp.Int32Data {
			putInt(t.Data, dt, i, int64(v))
		}
	}
	return t, nil
}

// putInt stores v as element i of an integer (or 16-bit float bits) array.
func putInt(b []byte, dt ir.DType, i int, v int64) {
	switch dt.Size() {
	case 1:
		b[i] = byte(v)
	case 2:
		binary.LittleEndian.PutUint16(b[2*i:], uint16(v))
	case 4:
		binary.LittleEndian.PutUint32(b[4*i:], uint32(v))
	case 8:
		binary.LittleEndian.PutUint64(b[8*i:], uint64(v))
	}
}

// readExternal reads the bytes of an externally stored tensor: the file
// named by "location" relative to dir (it may not leave dir), from
// "offset", "length" bytes (default: the rest of the file).
func readExternal(tp *onnxpb.TensorProto, dir string, size int64) ([]byte, error) {
	var loc string
	offset, length := int64(0), int64(-1)
	for _, kv := range tp.GetExternalData() {
		switch kv.GetKey() {
		case "location":
			loc = kv.GetValue()
		case "offset", "length":
			v, err := strconv.ParseInt(kv.GetValue(), 10, 64)
			if err != nil || v < 0 {
				return nil, fmt.Errorf("external data %s %q is not a byte count", kv.GetKey(), kv.GetValue())
			}
			if kv.GetKey() == "offset" {
				offset = v
			} else {
				length = v
			}
		}
	}
	if loc == "" {
		return nil, fmt.Errorf("external data has no location")
	}
	if dir == "" {
		return nil, fmt.Errorf("external data %q: the model was not read from a file, so there is no directory to find it in", loc)
	}
	clean := filepath.Clean(filepath.FromSlash(loc))
	if filepath.IsAbs(clean) || clean == ".." || strings.HasPrefix(clean, ".."+string(filepath.Separator)) {
		return nil, fmt.Errorf("external data location %q leaves the model's directory", loc)
	}
	f, err := os.Open(filepath.Join(dir, clean))
	if err != nil {
		return nil, fmt.Errorf("external data: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("external data: %w", err)
	}
	if length < 0 {
		length = st.Size() - offset
	}
	if length != size {
		return nil, fmt.Errorf("external data %q holds %d bytes; the dims need %d", loc, length, size)
	}
	if offset+length > st.Size() {
		return nil, fmt.Errorf("external data %q is %d bytes, too short for %d bytes at offset %d", loc, st.Size(), length, offset)
	}
	b := make([]byte, length)
	if _, err := f.ReadAt(b, offset); err != nil {
		return nil, fmt.Errorf("external data %q: %w", loc, err)
	}
	return b, nil
}

// NDArray copies the tensor into a host array on dev.
func (t *Tensor) NDArray(dev devices.Device) (*ndarray.NDArray, error) {
	return ndarray.FromBytes(t.Data, ndarray.Shape(t.Shape), t.DType, dev)
}

// ReadTensorProto decodes a serialized TensorProto (the input_N.pb and
// output_N.pb files of ONNX's backend tests).
func ReadTensorProto(b []byte) (*Tensor, error) {
	tp := &onnxpb.TensorProto{}
	if err := unmarshal(b, tp); err != nil {
		return nil, fmt.Errorf("not a TensorProto: %w", err)
	}
	return decodeTensor(tp, "")
}
