package onnx

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"google.golang.org/protobuf/proto"

	"github.com/kiln-ml/kiln/compiler/frontend/onnx/onnxpb"
)

// Opset versions of the default domain kiln imports. Below opset 7 only
// the operators whose definition then computes what opset 7's does are
// imported (see Check).
const (
	MinOpset = 1
	MaxOpset = 21
)

// ErrNotONNX is returned (wrapped) when the bytes are not an ONNX model.
var ErrNotONNX = errors.New("not an ONNX model")

// Model is a checked ONNX model: its graph's nodes in an order where
// every node comes after the nodes producing its inputs, its decoded
// initializers and the opset of the default domain.
type Model struct {
	Proto *onnxpb.ModelProto
	// Opset is the version of the default ("" or "ai.onnx") operator set.
	Opset int64
	// TrainingOpset is the version of the "ai.onnx.preview.training"
	// operator set (the optimizers), 0 when not imported.
	TrainingOpset int64
	// Nodes are the graph's nodes in topological order.
	Nodes []*onnxpb.NodeProto
	// Inputs are the graph inputs that are not initializers, in order.
	Inputs []*onnxpb.ValueInfoProto
	// Outputs are the graph outputs.
	Outputs []*onnxpb.ValueInfoProto
	// Initializers by name, and their names in file order.
	Initializers map[string]*Tensor
	InitOrder    []string
}

func unmarshal(b []byte, m proto.Message) error {
	return proto.UnmarshalOptions{RecursionLimit: 100}.Unmarshal(b, m)
}

// ReadFile reads and checks the model at path; external data files are
// looked up next to it.
func ReadFile(path string) (*Model, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	m, err := Read(b, filepath.Dir(path))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return m, nil
}

// Read parses and checks a serialized ModelProto. dir is where external
// data files are found ("" when the model has none).
func Read(b []byte, dir string) (*Model, error) {
	mp := &onnxpb.ModelProto{}
	if err := unmarshal(b, mp); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNotONNX, err)
	}
	if mp.GetIrVersion() <= 0 || mp.GetGraph() == nil || len(mp.GetOpsetImport()) == 0 {
		var missing []string
		if mp.GetIrVersion() <= 0 {
			missing = append(missing, "ir_version")
		}
		if len(mp.GetOpsetImport()) == 0 {
			missing = append(missing, "opset_import")
		}
		if mp.GetGraph() == nil {
			missing = append(missing, "graph")
		}
		return nil, fmt.Errorf("%w: no %s", ErrNotONNX, strings.Join(missing, ", no "))
	}
	m := &Model{Proto: mp, Initializers: map[string]*Tensor{}}
	for _, o := range mp.GetOpsetImport() {
		switch o.GetDomain() {
		case "", "ai.onnx":
			m.Opset = o.GetVersion()
		case trainingDomain:
			m.TrainingOpset = o.GetVersion()
		}
	}
	if m.Opset == 0 && m.TrainingOpset == 0 {
		return nil, fmt.Errorf("%w: the model imports no opset of the default ONNX domain (only %s)", ErrUnsupported, domains(mp))
	}
	if m.Opset > MaxOpset {
		return nil, fmt.Errorf("%w: opset %d is newer than kiln knows (%d–%d)", ErrUnsupported, m.Opset, MinOpset, MaxOpset)
	}
	if m.Opset != 0 && m.Opset < MinOpset { // 0: only the training operators
		return nil, fmt.Errorf("%w: opset %d is older than kiln imports (%d–%d)", ErrUnsupported, m.Opset, MinOpset, MaxOpset)
	}
	g := mp.GetGraph()
	defined := map[string]string{} // value name → what defines it
	for _, tp := range g.GetInitializer() {
		t, err := decodeTensor(tp, dir)
		if err != nil {
			return nil, fmt.Errorf("initializer: %w", err)
		}
		if t.Name == "" {
			return nil, fmt.Errorf("an initializer has no name")
		}
		if _, dup := m.Initializers[t.Name]; dup {
			return nil, fmt.Errorf("initializer %q defined twice", t.Name)
		}
		m.Initializers[t.Name] = t
		m.InitOrder = append(m.InitOrder, t.Name)
		defined[t.Name] = "initializer"
	}
	if len(g.GetSparseInitializer()) > 0 {
		return nil, fmt.Errorf("%w: sparse initializers", ErrUnsupported)
	}
	for _, in := range g.GetInput() {
		if in.GetName() == "" {
			return nil, fmt.Errorf("a graph input has no name")
		}
		if _, ok := m.Initializers[in.GetName()]; ok {
			continue // an initializer listed as an input (IR < 4) is a weight
		}
		if _, dup := defined[in.GetName()]; dup {
			return nil, fmt.Errorf("graph input %q defined twice", in.GetName())
		}
		defined[in.GetName()] = "input"
		m.Inputs = append(m.Inputs, in)
	}
	nodes, err := sortNodes(g.GetNode(), defined)
	if err != nil {
		return nil, err
	}
	m.Nodes = nodes
	if len(g.GetOutput()) == 0 {
		return nil, fmt.Errorf("the graph has no outputs")
	}
	for _, out := range g.GetOutput() {
		if _, ok := defined[out.GetName()]; !ok {
			return nil, fmt.Errorf("graph output %q is produced by no node, input or initializer", out.GetName())
		}
	}
	m.Outputs = g.GetOutput()
	return m, nil
}

// NodeName describes a node for error messages: its name (or its index
// when it has none) and op type.
func NodeName(n *onnxpb.NodeProto, index int) string {
	if n.GetName() != "" {
		return fmt.Sprintf("node %q (%s)", n.GetName(), n.GetOpType())
	}
	return fmt.Sprintf("node #%d (%s)", index, n.GetOpType())
}

// sortNodes orders nodes so that each comes after the producers of its
// inputs (Kahn's algorithm, keeping file order among ready nodes). A
// value produced twice, an input nothing produces and a cycle are
// errors naming the node and the value.
func sortNodes(nodes []*onnxpb.NodeProto, defined map[string]string) ([]*onnxpb.NodeProto, error) {
	producer := map[string]int{}
	for i, n := range nodes {
		for _, o := range n.GetOutput() {
			if o == "" {
				continue
			}
			if what, ok := defined[o]; ok {
				return nil, fmt.Errorf("%s: output %q is already defined by an %s", NodeName(n, i), o, what)
			}
			if j, ok := producer[o]; ok {
				return nil, fmt.Errorf("%s: output %q is also produced by %s", NodeName(n, i), o, NodeName(nodes[j], j))
			}
			producer[o] = i
		}
	}
	indeg := make([]int, len(nodes))
	users := make([][]int, len(nodes))
	for i, n := range nodes {
		for _, in := range n.GetInput() {
			if in == "" {
				continue // an optional input left out
			}
			if _, ok := defined[in]; ok {
				continue
			}
			j, ok := producer[in]
			if !ok {
				return nil, fmt.Errorf("%s: input %q is not a graph input, an initializer or any node's output", NodeName(n, i), in)
			}
			indeg[i]++
			users[j] = append(users[j], i)
		}
	}
	var order []*onnxpb.NodeProto
	var ready []int
	for i := range nodes {
		if indeg[i] == 0 {
			ready = append(ready, i)
		}
	}
	done := make([]bool, len(nodes))
	for len(ready) > 0 {
		i := ready[0]
		ready = ready[1:]
		done[i] = true
		order = append(order, nodes[i])
		for _, u := range users[i] {
			if indeg[u]--; indeg[u] == 0 {
				ready = append(ready, u)
			}
		}
	}
	if len(order) != len(nodes) {
		var names []string
		for i, n := range nodes {
			if !done[i] {
				names = append(names, NodeName(n, i))
				if len(names) == 4 {
					names = append(names, "…")
					break
				}
			}
		}
		return nil, fmt.Errorf("the graph has a cycle through %s", strings.Join(names, ", "))
	}
	for _, n := range order {
		for _, o := range n.GetOutput() {
			if o != "" {
				defined[o] = "node"
			}
		}
	}
	return order, nil
}

// domains lists the operator-set domains a model imports.
func domains(mp *onnxpb.ModelProto) string {
	var ds []string
	for _, o := range mp.GetOpsetImport() {
		ds = append(ds, fmt.Sprintf("%q", o.GetDomain()))
	}
	return strings.Join(ds, ", ")
}
