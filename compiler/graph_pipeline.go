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
// comes back as it is. layouts are the graph-level layout choices, each
// convolution's kernel layout and each dense layer's weight layout by its
// signature (relaxtransform.AlterConvLayoutWith, AlterDenseLayoutWith;
// nil: the defaults).
func GraphPipeline(mod *ir.IRModule, target Target, pipeline string, noDefaultSchedule bool, layouts map[string]string) (*ir.IRModule, error) {
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
	if packsDense(info, pipeline, noDefaultSchedule) {
		// Dense layers' weights packed in the default schedule's column
		// panels; a tuning database's records are for the packed kernels,
		// as kiln tune lowers the model the same way.
		if mod, err = relaxtransform.AlterDenseLayoutWith(max(info.VectorBytes, 16), layouts)(mod); err != nil {
			return nil, err
		}
	}
	ps, err := relaxtransform.Pipeline(pipeline)
	if err != nil {
		return nil, err
	}
	if layouts != nil {
		altered := false
		for i, p := range ps {
			if p.Name == "AlterConvLayout" {
				ps[i].Fn, altered = relaxtransform.AlterConvLayoutWith(layouts), true
			}
		}
		if !altered {
			for _, s := range relaxtransform.ConvSites(mod) {
				if _, ok := layouts[s.Key]; ok {
					return nil, fmt.Errorf("pipeline %s: kernel layouts are chosen for its convolutions, but it does not run AlterConvLayout", pipeline)
				}
			}
		}
	}
	if mod, err = relaxtransform.RunPasses(mod, ps, relaxtransform.Options{Verify: true}); err != nil {
		return nil, fmt.Errorf("pipeline %s: %w", pipeline, err)
	}
	return mod, nil
}

// packsDense says whether GraphPipeline packs the dense layers' weights
// (AlterDenseLayout) for a target of info through pipeline.
func packsDense(info TargetInfo, pipeline string, noDefaultSchedule bool) bool {
	return info.PackDense && (pipeline == "O2" || pipeline == "O3") && !noDefaultSchedule
}

// Lowering lowers a module with graph functions through the graph
// pipeline with the given layout choices (see GraphPipeline).
type Lowering = relaxtransform.Lowering

// LayoutLowering is the Lowering of mod through pipeline ("" means
// DefaultPipeline) for target, with the layout sites it has: the
// convolutions when the pipeline runs AlterConvLayout, the dense layers
// when GraphPipeline packs their weights; nil when there is no layout to
// choose (mod has no graph functions, or no such site).
func LayoutLowering(mod *ir.IRModule, target Target, pipeline string, noDefaultSchedule bool) *Lowering {
	if pipeline == "" {
		pipeline = DefaultPipeline
	}
	if !vmgen.HasGraphFunctions(mod) || pipeline == "none" {
		return nil
	}
	var sites []relaxtransform.LayoutSite
	if pipelineAlters(pipeline) {
		sites = relaxtransform.ConvSites(mod)
	}
	if info, err := target.Info(); err == nil && packsDense(info, pipeline, noDefaultSchedule) {
		sites = append(sites, relaxtransform.DenseSites(mod, max(info.VectorBytes, 16))...)
	}
	if len(sites) == 0 {
		return nil
	}
	return &Lowering{Sites: sites, Lower: func(layouts map[string]string) (*ir.IRModule, error) {
		return GraphPipeline(mod, target, pipeline, noDefaultSchedule, layouts)
	}}
}

// pipelineAlters reports whether pipeline runs AlterConvLayout.
func pipelineAlters(pipeline string) bool {
	ps, err := relaxtransform.Pipeline(pipeline)
	if err != nil {
		return false
	}
	for _, p := range ps {
		if p.Name == "AlterConvLayout" {
			return true
		}
	}
	return false
}
