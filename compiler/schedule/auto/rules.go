package auto

import (
	"errors"
	"fmt"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/schedule"
)

// The default schedules are rules in an ordered list per kind of target,
// as in TVM's DLight: cpuRules for CPUs, gpuRules for GPUs. Each rule is
// a name and an apply function that returns the scheduled function and
// true, or false when the rule does not apply to the function; the first
// rule that applies schedules it. "Does not apply" is not an error: an
// error is a bug in the rule (a primitive refusing what the rule's own
// checks let through), and FuncRule and GPUFunc report it with the
// rule's name instead of trying the next rule.

// A rule is one default schedule of the list of a kind of target.
type rule[In any] struct {
	name  string
	apply func(in In) (*scheduled, bool, error)
}

// scheduled is what a rule makes of a function: the scheduled function
// and the trace of the primitives that made it from the rule's input
// (the function given to FuncRule), which replays to it.
type scheduled struct {
	f     *ir.PrimFunc
	trace []string
}

// done is the result of a rule that scheduled s.
func done(s *schedule.Schedule) *scheduled { return &scheduled{f: s.Func(), trace: s.Trace()} }

// cpuIn is what a CPU rule schedules: the function and the target's
// options (vector width, registers, caches: see Options).
type cpuIn struct {
	f    *ir.PrimFunc
	opts Options
}

// cpuRules are the CPU's default rules, in the order they are tried.
var cpuRules = []rule[cpuIn]{
	{RuleMatmul, matmulRule},
	{RuleConvStem, onConvs(findConvs, scheduleStem)},
	{RulePointwise, onConvs(findConvs, schedulePackedPointwise)},
	{RuleConv, onConvs(findConvs, func(f *ir.PrimFunc, c convBlock, opts Options) (*scheduled, error) {
		return withEpilogue(f, func(s *schedule.Schedule, epilogue bool) error { return convSchedule(s, c, opts, epilogue) })
	})},
	{RuleGlobalPool, onConvs(findRowConvs, scheduleGlobalPool)},
	{RulePoolRows, onConvs(findRowConvs, schedulePoolRows)},
	{RulePointwise, onConvs(findRowConvs, schedulePointwise)},
	{RuleDepthwisePlane, onConvs(findRowConvs, scheduleDepthwisePlane)},
	// Rows of stride 1 keep the register tile along the row where the
	// plane rule does not apply.
	{RuleRowConv, onConvs(findRowConvs, func(f *ir.PrimFunc, c convBlock, opts Options) (*scheduled, error) {
		if !unitRows(f, c) {
			return nil, skip("block %q reads its rows with a stride", c.name)
		}
		return withEpilogue(f, func(s *schedule.Schedule, epilogue bool) error { return rowConvSchedule(s, c, opts, epilogue) })
	})},
	{RuleRowPipeline, scheduleRowPipeline},
	{RuleGeneric, func(in cpuIn) (*scheduled, bool, error) { return scheduleGeneric(in.f, in.opts) }},
}

// gpuIn is what a GPU rule schedules: the function, the options, and the
// function with its spatial producers inlined into their consumers
// (what the matmul and fallback rules schedule), made once.
type gpuIn struct {
	f       *ir.PrimFunc
	opts    GPUOptions
	inlined *schedule.Schedule
	blocks  []*ir.BlockRealize
	err     error
	done    bool
}

// gpuRules are the GPU's default rules, in the order they are tried; the
// fallback applies to every function of spatial loops around reductions
// whose later blocks read what a thread computed.
var gpuRules = []rule[*gpuIn]{
	{"row reduction", onFunc(rowReduction)},
	{"row pipeline", onFunc(rowPipeline)},
	{"tensor-core matmul", mmaRule},
	{"shared-memory matmul", onInlinedSchedule(sharedMatmul)},
	{"matmul", bindRule(func(s *schedule.Schedule, br *ir.BlockRealize, _ GPUOptions) (schedule.LoopRV, bool, error) {
		return bindMatmul(s, br)
	})},
	{"fallback", bindRule(func(s *schedule.Schedule, br *ir.BlockRealize, opts GPUOptions) (schedule.LoopRV, bool, error) {
		l, err := bindFallback(s, br, opts)
		return l, err == nil, err
	})},
}

// notApplicable is the error of a rule's check that finds a function
// not of the rule's form: the rule does not apply, which is no error.
type notApplicable struct{ reason string }

func (n *notApplicable) Error() string { return n.reason }

// skip says why a rule does not apply.
func skip(format string, args ...any) error {
	return &notApplicable{reason: fmt.Sprintf(format, args...)}
}

// skipped reports whether err says a rule does not apply.
func skipped(err error) bool {
	var n *notApplicable
	return errors.As(err, &n)
}

// applyRules tries rules in order on in and returns the first one's
// result and name, or "" when none applies (why the last one did not in
// last). An error is a rule's bug, named with it.
func applyRules[In any](rules []rule[In], in In, kind string) (g *scheduled, name string, last error, err error) {
	for _, r := range rules {
		g, ok, err := r.apply(in)
		switch {
		case skipped(err):
			last = err
		case err != nil:
			return nil, "", nil, fmt.Errorf("%s rule %q: %w", kind, r.name, err)
		case ok && (g == nil || g.f == nil):
			return nil, "", nil, fmt.Errorf("%s rule %q: applied without a function", kind, r.name)
		case ok:
			return g, r.name, nil, nil
		}
	}
	return nil, "", last, nil
}

// onConvs makes a CPU rule of sched over the blocks find finds: the
// first block it schedules is the rule's result.
func onConvs(find func(*ir.PrimFunc) []convBlock, sched func(*ir.PrimFunc, convBlock, Options) (*scheduled, error)) func(cpuIn) (*scheduled, bool, error) {
	return func(in cpuIn) (*scheduled, bool, error) {
		var last error
		for _, c := range find(in.f) {
			g, err := sched(in.f, c, in.opts)
			switch {
			case skipped(err):
				last = err
			case err != nil:
				return nil, false, fmt.Errorf("block %q: %w", c.name, err)
			case g != nil:
				return g, true, nil
			}
		}
		return nil, false, last
	}
}

// matmulRule register-blocks the first matmul-shaped block of f (see
// scheduleMatmul), with its epilogue on the register tile where the
// primitives allow it.
func matmulRule(in cpuIn) (*scheduled, bool, error) {
	for _, m := range findMatmuls(in.f) {
		applied := false
		g, err := withEpilogue(in.f, func(s *schedule.Schedule, epilogue bool) error {
			ok, err := scheduleMatmul(s, m, in.opts, epilogue)
			if err == nil && !ok {
				return skip("block %q takes no register tile", m.name)
			}
			applied = ok
			return err
		})
		switch {
		case skipped(err):
			continue
		case err != nil:
			return nil, false, fmt.Errorf("block %q: %w", m.name, err)
		case applied:
			return g, true, nil
		}
	}
	return nil, false, nil
}

// withEpilogue applies sched to a schedule of f, first with the blocks
// after the rule's block (bias, activation, residual add) computed on its
// register tile, then, where that fails (the primitives refuse the
// epilogue), with the tile stored as it is; it returns the scheduled
// function, or sched's error without the epilogue.
func withEpilogue(f *ir.PrimFunc, sched func(s *schedule.Schedule, epilogue bool) error) (*scheduled, error) {
	var err error
	for _, epilogue := range []bool{true, false} {
		s, serr := schedule.New(f)
		if serr != nil {
			return nil, serr
		}
		if err = sched(s, epilogue); err == nil {
			return done(s), nil
		}
	}
	return nil, err
}

// Applied is what the default rules made of a function.
type Applied struct {
	// Func is the scheduled function (the function as it was given when
	// no rule applies).
	Func *ir.PrimFunc
	// Rule names the rule that applied (one of the Rule constants on a
	// CPU, a gpuRules name on a GPU), or "" when none did.
	Rule string
	// Trace is the schedule's primitives from the function given,
	// choices included (sample_categorical with their decisions), which
	// schedule.Replay replays to Func; nil when no rule applied.
	Trace []string
}

// Apply gives f the first of the CPU rules that applies (see the package
// doc), with the choices opts.Decide makes (each rule's own without one);
// f itself is never modified. A function that is not made of blocks
// (written with loops and stores of its own) takes no rule. An error is
// a rule's bug, named with the rule.
func Apply(f *ir.PrimFunc, opts Options) (Applied, error) {
	if _, err := schedule.New(f); err != nil {
		return Applied{Func: f}, nil
	}
	g, name, _, err := applyRules(cpuRules, cpuIn{f: f, opts: opts.withDefaults()}, "cpu")
	if err != nil || name == "" {
		return Applied{Func: f}, err
	}
	return Applied{Func: g.f, Rule: name, Trace: g.trace}, nil
}

// FuncRule is Apply returning the function and the rule's name.
func FuncRule(f *ir.PrimFunc, opts Options) (*ir.PrimFunc, string, error) {
	a, err := Apply(f, opts)
	return a.Func, a.Rule, err
}

// Func schedules f with the first CPU rule that applies and reports
// whether one did; f itself is never modified. A function no rule
// applies to, or one whose loops were already transformed, comes back
// unchanged with false.
func Func(f *ir.PrimFunc, opts Options) (*ir.PrimFunc, bool, error) {
	g, rule, err := FuncRule(f, opts)
	return g, rule != "", err
}

// GPUFunc gives f the first of the GPU rules that applies. A function
// that is one sum over a reduction loop of at least 64 (a GEMV, a row
// sum) gets the cross-thread rule (see rowReduction); a function of row
// reductions and elementwise blocks over the same rows (softmax, layer
// norm) gets one block of threads per row (see rowPipeline); otherwise
// spatial producers that can be inlined into their consumers are, and a
// first remaining block that is a 2-D matmul of float16 or bfloat16
// operands whose sizes tensor cores tile gets the tensor-core rule
// (ptx_mma m16n8k16 on warp tiles staged through shared memory, see
// mmaMatmulRule) when the blocks after it are elementwise epilogues;
// another 2-D matmul large enough for 64 threads gets the shared-memory
// matmul rule (tiles of A and B staged in shared memory, register tiles
// of up to 4×4 per thread, 16×16 threads per block, see sharedMatmul)
// when the blocks after it are elementwise epilogues, else the
// register-only matmul rule (see bindMatmul); otherwise the fallback rule
// (DLight's Fallback): the block gets its spatial loops fused and split
// into blockIdx.x and threadIdx.x (a predicate guards the tail when the
// block size does not divide the extent), its reduction loops stay serial
// inside each thread; every later block (an epilogue such as a bias add
// after a matmul) is moved under that block's threadIdx.x loop, so each
// thread finishes the elements it computed and the intermediate buffer
// becomes private to the thread. When no rule applies it returns an
// error saying why the fallback does not: a later block that reads more
// of the intermediate than its thread produced (a reduction over it), or
// reduction loops outside the spatial ones. Any other error is a rule's
// bug, named with the rule.
func GPUFunc(f *ir.PrimFunc, opts GPUOptions) (*ir.PrimFunc, error) {
	a, err := ApplyGPU(f, opts)
	return a.Func, err
}

// ApplyGPU is GPUFunc returning the rule and its trace as Apply does.
func ApplyGPU(f *ir.PrimFunc, opts GPUOptions) (Applied, error) {
	if opts.ThreadsPerBlock <= 0 {
		opts.ThreadsPerBlock = 256
	}
	g, name, last, err := applyRules(gpuRules, &gpuIn{f: f, opts: opts}, "gpu")
	switch {
	case err != nil:
		return Applied{}, err
	case name == "" && last != nil:
		return Applied{}, last
	case name == "":
		return Applied{}, errors.New("gpu schedule: no rule applies")
	}
	return Applied{Func: g.f, Rule: name, Trace: g.trace}, nil
}

// prepare inlines the spatial producers of in's function into their
// consumers, once, where the primitives allow it (a block that writes a
// parameter or is not one to one stays).
func (in *gpuIn) prepare() ([]*ir.BlockRealize, error) {
	if in.done {
		return in.blocks, in.err
	}
	in.done = true
	s, err := schedule.New(in.f)
	if err != nil {
		in.err = skip("gpu schedule: %v", err)
		return nil, in.err
	}
	blocks := topBlocks(s.Func())
	if len(blocks) == 0 {
		in.err = skip("gpu schedule: the function has no block to schedule")
		return nil, in.err
	}
	for _, br := range blocks[:len(blocks)-1] {
		if !isSpatial(br.Block) {
			continue
		}
		c := s.Copy()
		b, err := c.GetBlock(br.Block.Name)
		if err != nil {
			in.err = err
			return nil, err
		}
		// Inlining is tried: a refusal keeps the block.
		if c.ComputeInline(b) == nil {
			s = c
		}
	}
	in.inlined, in.blocks = s, topBlocks(s.Func())
	return in.blocks, nil
}

// bindRule makes a GPU rule of bind, which binds the loops of the first
// block (of the function with its producers inlined) to threads and
// returns its threadIdx.x loop, or ok=false when it does not apply: the
// later blocks are computed in the threads of that loop.
func bindRule(bind func(*schedule.Schedule, *ir.BlockRealize, GPUOptions) (schedule.LoopRV, bool, error)) func(*gpuIn) (*scheduled, bool, error) {
	return func(in *gpuIn) (*scheduled, bool, error) {
		blocks, err := in.prepare()
		if err != nil {
			return nil, false, err
		}
		s := in.inlined.Copy()
		thread, ok, err := bind(s, blocks[0], in.opts)
		if err != nil || !ok {
			return nil, false, err
		}
		for _, br := range blocks[1:] {
			b, err := s.GetBlock(br.Block.Name)
			if err != nil {
				return nil, false, err
			}
			if err := s.ReverseComputeAt(b, thread); err != nil {
				return nil, false, skip("gpu schedule: block %q cannot run in the threads of block %q (one kernel per function): %v", br.Block.Name, blocks[0].Block.Name, err)
			}
		}
		return done(s), true, nil
	}
}

// blockLoops returns block name of s and the loops around it.
func blockLoops(s *schedule.Schedule, name string) (schedule.BlockRV, []schedule.LoopRV, error) {
	b, err := s.GetBlock(name)
	if err != nil {
		return b, nil, err
	}
	loops, err := s.GetLoops(b)
	return b, loops, err
}
