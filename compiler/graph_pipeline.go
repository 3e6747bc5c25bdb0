package compiler

import (
	"fmt"

	vmgen "github.com/kiln-ml/kiln/compiler/codegen/vm"
	"github.com/kiln-ml/kiln/compiler/ir"
	relaxtransform "github.com/kiln-ml/kiln/compiler/relax/transform"
)

// GraphPipeline runs the graph-level lowering Build runs on a module with
// graph functions, up to the fused PrimFuncs that Build then schedules and
// compiles: pipeline ("" means DefaultPipeline; see
// compiler/relax/transform.PipelineNames), preceded on the CPU by the dense
// layers' weight packing (AlterDenseLayout) unless noDefaultSchedule says
// the kernels are built as written. kiln tune lowers a model through it, so
// the kernels it tunes are exactly those a build compiles, with or without
// a tuning database. A module without graph functions, or pipeline "none",
// comes back as it is.
func GraphPipeline(mod *ir.IRModule, target Target, pipeline string, noDefaultSchedule bool) (*ir.IRModule, error) {
	if !vmgen.HasGraphFunctions(mod) || pipeline == "none" {
		return mod, nil
	}
	if pipeline == "" {
		pipeline = DefaultPipeline
	}
	info, err := target.Info()
	if err != nil {
		return nil, err
	}
	if info.PackDense && (pipeline == "O2" || pipeline == "O3") && !noDefaultSchedule {
		// Dense layers' weights packed in the default schedule's column
		// panels; a tuning database's records are for the packed kernels,
		// as kiln tune lowers the model the same way.
		if mod, err = relaxtransform.AlterDenseLayout(mod, max(info.VectorBytes, 16)); err != nil {
			return nil, err
		}
	}
	if mod, err = relaxtransform.RunPipeline(mod, pipeline); err != nil {
		return nil, fmt.Errorf("pipeline %s: %w", pipeline, err)
	}
	return mod, nil
}
