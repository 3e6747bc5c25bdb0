package nn_test

import (
	"fmt"

	"github.com/kiln-ml/kiln/compiler/frontend/nn"
	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/script"
)

// RelaxModel is the IRModule tutorial's model written as a user type, like the
// Python class that subclasses nn.Module.
type RelaxModel struct {
	fc1, relu1, fc2 nn.Module
}

func NewRelaxModel() *RelaxModel {
	return &RelaxModel{fc1: nn.NewLinear(784, 256, true), relu1: nn.NewReLU(), fc2: nn.NewLinear(256, 10, true)}
}

func (m *RelaxModel) Children() []nn.Child {
	return []nn.Child{nn.Named("fc1", m.fc1), nn.Named("relu1", m.relu1), nn.Named("fc2", m.fc2)}
}

func (m *RelaxModel) Params() []nn.NamedParam { return nil }

func (m *RelaxModel) Forward(b *nn.Builder, x *nn.Tensor) (*nn.Tensor, error) {
	for _, l := range []nn.Module{m.fc1, m.relu1, m.fc2} {
		var err error
		if x, err = l.Forward(b, x); err != nil {
			return nil, err
		}
	}
	return x, nil
}

func Example() {
	mod, params, err := nn.Export(NewRelaxModel(), nn.Spec{
		Func:   "forward",
		Inputs: []nn.Input{{Name: "x", Shape: []int64{1, 784}, DType: ir.Float32}},
		Seed:   0,
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(params.Names())
	f, _ := mod.Lookup("forward")
	fmt.Println(script.Print(f.(*ir.Function).Ret))
	// Output:
	// [fc1.weight fc1.bias fc2.weight fc2.bias]
	// R.Tensor((1, 10), dtype="float32")
}
