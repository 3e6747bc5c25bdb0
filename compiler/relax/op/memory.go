package op

import (
	"github.com/kiln-ml/kiln/compiler/ir"
)

// Memory and VM builtins: storage allocation with a scope, tensors placed
// in storage at an offset, and the kills that end their lives. The vm.*
// forms are what the VM runs (impure, as in the Relax VM storage-scope example); memory.* and
// builtin.alloc_tensor are the planner's pure forms.

func init() {
	mustRegister(&Def{Name: "relax.vm.alloc_storage", Impure: true,
		Args: []Arg{{Name: "size", Kind: ArgShape}, {Name: "runtime_device_index", Kind: ArgPrim},
			{Name: "dtype", Kind: ArgDType}, {Name: "storage_scope", Kind: ArgString}},
		Infer: inferObject})
	mustRegister(&Def{Name: "relax.vm.alloc_tensor", Impure: true,
		Args: []Arg{{Name: "storage", Kind: ArgAny}, {Name: "offset", Kind: ArgPrim},
			{Name: "shape", Kind: ArgShape}, {Name: "dtype", Kind: ArgDType}},
		Infer: inferAllocTensor(2, 3)})
	mustRegister(&Def{Name: "relax.vm.kill_object", Impure: true, Args: []Arg{{Name: "obj", Kind: ArgAny}}, Infer: inferVoid})
	mustRegister(&Def{Name: "relax.builtin.alloc_tensor",
		Args: []Arg{{Name: "shape", Kind: ArgShape}, {Name: "dtype", Kind: ArgDType},
			{Name: "runtime_device_index", Kind: ArgPrim}, {Name: "storage_scope", Kind: ArgString, Optional: true}},
		Infer: inferAllocTensor(0, 1)})
	mustRegister(&Def{Name: "relax.memory.alloc_storage",
		Args: []Arg{{Name: "size", Kind: ArgShape}, {Name: "virtual_device_index", Kind: ArgPrim},
			{Name: "storage_scope", Kind: ArgString}, {Name: "dtype", Kind: ArgDType}},
		Infer: inferObject})
	mustRegister(&Def{Name: "relax.memory.alloc_tensor",
		Args: []Arg{{Name: "storage", Kind: ArgAny}, {Name: "offset", Kind: ArgPrim},
			{Name: "shape", Kind: ArgShape}, {Name: "dtype", Kind: ArgDType}},
		Infer: inferAllocTensor(2, 3)})
	mustRegister(&Def{Name: "relax.memory.kill_storage", Impure: true, Args: []Arg{{Name: "storage", Kind: ArgAny}}, Infer: inferVoid})
	mustRegister(&Def{Name: "relax.memory.kill_tensor", Impure: true, Args: []Arg{{Name: "tensor", Kind: ArgAny}}, Infer: inferVoid})
}

func inferObject(*ir.RCall) (ir.StructInfo, error) { return ir.Object(), nil }

func inferVoid(*ir.RCall) (ir.StructInfo, error) { return ir.VoidInfo(), nil }

// inferAllocTensor gives a tensor whose shape is argument shape and whose
// dtype is argument dtype.
func inferAllocTensor(shape, dtype int) func(c *ir.RCall) (ir.StructInfo, error) {
	return func(c *ir.RCall) (ir.StructInfo, error) {
		vals, ndim, err := shapeArg(c, shape)
		if err != nil {
			return nil, err
		}
		dt := ir.Void
		if d, ok := c.Args[dtype].(*ir.DataTypeImm); ok {
			dt = d.DType
		}
		if vals == nil {
			return ir.TensorNDim(dt, ndim), nil
		}
		return ir.Tensor(dt, vals...), nil
	}
}
