package nn

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"slices"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/devices"
	"github.com/kiln-ml/kiln/ndarray"
)

// orderKey is the safetensors metadata entry that keeps the parameters'
// order (a JSON list of names); safetensors itself sorts them.
const orderKey = "kiln.param_order"

// Param is one weight: its dotted name, shape, dtype and compact
// little-endian row-major data.
type Param struct {
	Name  string
	Shape []int64
	DType ir.DType
	Data  []byte
}

// Params is an ordered set of weights, in the order of the exported
// function's parameters.
type Params struct {
	list []Param
}

// Len is the number of weights.
func (p *Params) Len() int { return len(p.list) }

// Names returns the weights' names in order.
func (p *Params) Names() []string {
	out := make([]string, len(p.list))
	for i, x := range p.list {
		out[i] = x.Name
	}
	return out
}

// List returns the weights in order (sharing their data).
func (p *Params) List() []Param { return slices.Clone(p.list) }

// Get returns the weight called name.
func (p *Params) Get(name string) (Param, bool) {
	for _, x := range p.list {
		if x.Name == name {
			return x, true
		}
	}
	return Param{}, false
}

// NDArrays copies the weights to arrays on dev, keyed by name.
func (p *Params) NDArrays(dev devices.Device) (map[string]*ndarray.NDArray, error) {
	out := make(map[string]*ndarray.NDArray, len(p.list))
	for _, x := range p.list {
		a, err := ndarray.FromBytes(x.Data, x.Shape, x.DType, dev)
		if err != nil {
			return nil, fmt.Errorf("parameter %q: %w", x.Name, err)
		}
		out[x.Name] = a
	}
	return out, nil
}

// Save writes the weights to a safetensors file (through host arrays: a
// CPU backend must be linked), recording their order in the metadata.
func (p *Params) Save(path string) error {
	arrs, err := p.NDArrays(devices.CPUDevice)
	if err != nil {
		return fmt.Errorf("save parameters: %w", err)
	}
	order, err := json.Marshal(p.Names())
	if err != nil {
		return fmt.Errorf("save parameters: %w", err)
	}
	if err := ndarray.SaveSafetensors(path, arrs, map[string]string{orderKey: string(order)}); err != nil {
		return fmt.Errorf("save parameters: %w", err)
	}
	return nil
}

// LoadParams reads weights saved by Save (or any safetensors file: then
// in name order).
func LoadParams(path string) (*Params, error) {
	arrs, meta, err := ndarray.LoadSafetensors(path)
	if err != nil {
		return nil, fmt.Errorf("load parameters: %w", err)
	}
	var order []string
	if s, ok := meta[orderKey]; ok {
		if err := json.Unmarshal([]byte(s), &order); err != nil {
			return nil, fmt.Errorf("load parameters %q: metadata %q: %w", path, orderKey, err)
		}
		if len(order) != len(arrs) {
			return nil, fmt.Errorf("load parameters %q: metadata lists %d names, the file holds %d tensors", path, len(order), len(arrs))
		}
	} else {
		for name := range arrs {
			order = append(order, name)
		}
		slices.Sort(order)
	}
	ps := &Params{}
	for _, name := range order {
		a, ok := arrs[name]
		if !ok {
			return nil, fmt.Errorf("load parameters %q: metadata names %q, which the file does not hold", path, name)
		}
		data, err := a.Bytes()
		if err != nil {
			return nil, fmt.Errorf("load parameters %q: %q: %w", path, name, err)
		}
		ps.list = append(ps.list, Param{Name: name, Shape: a.Shape().Clone(), DType: a.DType(), Data: data})
	}
	return ps, nil
}

// values returns p's initial data, drawn for name from seed.
func (p *Parameter) values(name string, seed uint64) ([]byte, error) {
	vals, err := fill(p, name, seed)
	if err != nil {
		return nil, err
	}
	switch p.dtype {
	case ir.Float32:
		out := make([]byte, 4*len(vals))
		for i, v := range vals {
			binary.LittleEndian.PutUint32(out[4*i:], math.Float32bits(float32(v)))
		}
		return out, nil
	case ir.Float64:
		out := make([]byte, 8*len(vals))
		for i, v := range vals {
			binary.LittleEndian.PutUint64(out[8*i:], math.Float64bits(v))
		}
		return out, nil
	}
	return nil, fmt.Errorf("parameter %q: cannot initialize dtype %s (float32 and float64 only)", name, p.dtype)
}
