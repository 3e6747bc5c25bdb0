package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/kiln-ml/kiln/compiler"
	"github.com/kiln-ml/kiln/compiler/frontend/nn"
	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/devices"
	"github.com/kiln-ml/kiln/load"
	"github.com/kiln-ml/kiln/ndarray"
	"github.com/kiln-ml/kiln/packedfunc"
	"github.com/kiln-ml/kiln/vm"
)

func init() {
	register(benchmark{
		name:    "mlp",
		summary: "the IRModule tutorial's MLP (1x784 -> 256 -> 10, fp32) end to end through the VM, latency against PyTorch eager on CPU",
		run:     runMLP,
	})
}

// mlpResult is the mlp benchmark's report: latencies in microseconds per
// forward pass (medians over rounds), ratio = kiln pooled / PyTorch.
type mlpResult struct {
	Name        string   `json:"name"`
	Rounds      int      `json:"rounds"`
	MinBatchMS  float64  `json:"min_batch_ms"`
	PooledUS    float64  `json:"pooled_us"`
	NaiveUS     float64  `json:"naive_us"`
	TorchUS     float64  `json:"torch_us,omitempty"`
	Ratio       float64  `json:"ratio,omitempty"` // pooled / torch; goal ≤ 0.5
	GoalRatio   float64  `json:"goal_ratio"`
	PooledNaive float64  `json:"pooled_vs_naive"` // pooled / naive
	MaxAbsDiff  float64  `json:"max_abs_diff_vs_torch,omitempty"`
	Torch       string   `json:"torch,omitempty"`
	NoReference string   `json:"no_reference,omitempty"`
	Pipeline    string   `json:"pipeline"`
	Kernels     []string `json:"kernels"`
	Quick       bool     `json:"quick,omitempty"`
}

func (r mlpResult) Line() string {
	s := fmt.Sprintf("mlp: kiln pooled %.2f µs, naive %.2f µs (pooled/naive %.3f)", r.PooledUS, r.NaiveUS, r.PooledNaive)
	if r.TorchUS > 0 {
		s += fmt.Sprintf("; PyTorch %.2f µs; ratio %.3f (goal ≤ %.1f); max |kiln − torch| %.2g", r.TorchUS, r.Ratio, r.GoalRatio, r.MaxAbsDiff)
	} else {
		s += "; no ratio: " + r.NoReference
	}
	return s
}

func mlpModel() nn.Module {
	return nn.NewNamedSequential(
		nn.Named("fc1", nn.NewLinear(784, 256, true)),
		nn.Named("relu1", nn.NewReLU()),
		nn.Named("fc2", nn.NewLinear(256, 10, true)),
	)
}

// runMLP builds the MLP with compiler.Build's defaults (the O2 pipeline:
// zero plus LiftTransformParams, so the weight transposes run once per set
// of weights; then the default CPU schedules of compiler/schedule/auto), checks it against
// PyTorch on the same weights and input, and times one forward pass with
// the pooled and the naive allocator and in PyTorch, interleaved.
func runMLP(ctx context.Context, opt options) (result, error) {
	rounds, minBatch := 7, 200*time.Millisecond
	if opt.quick {
		rounds, minBatch = 1, 2*time.Millisecond
	}
	r := mlpResult{Name: "mlp", Rounds: rounds, MinBatchMS: float64(minBatch) / 1e6, GoalRatio: 0.5, Quick: opt.quick, Pipeline: compiler.DefaultPipeline}
	mod, params, err := nn.Export(mlpModel(), nn.Spec{Inputs: []nn.Input{{Name: "x", Shape: []int64{1, 784}, DType: ir.Float32}}, Seed: 1})
	if err != nil {
		return nil, err
	}
	a, err := compiler.Build(ctx, mod, compiler.Target{Kind: "cpu"}, compiler.BuildOptions{})
	if err != nil {
		return nil, err
	}
	for _, f := range a.Manifest.Functions {
		r.Kernels = append(r.Kernels, f.Name)
	}
	dir, err := os.MkdirTemp("", "kiln-bench-mlp-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	pooled, err := load.Artifact(a, load.Options{MemoryCfg: vm.MemoryPooled})
	if err != nil {
		return nil, err
	}
	defer pooled.Close()
	naive, err := load.Artifact(a, load.Options{MemoryCfg: vm.MemoryNaive})
	if err != nil {
		return nil, err
	}
	defer naive.Close()
	rng := rand.New(rand.NewPCG(5, 5))
	xs := make([]float32, 784)
	for i := range xs {
		xs[i] = rng.Float32()*2 - 1
	}
	x, err := ndarray.FromSlice(xs, ndarray.Shape{1, 784})
	if err != nil {
		return nil, err
	}
	ps, err := params.NDArrays(devices.CPUDevice)
	if err != nil {
		return nil, err
	}
	args := []packedfunc.Value{packedfunc.Array(x)}
	for _, name := range params.Names() {
		args = append(args, packedfunc.Array(ps[name]))
	}
	out, err := pooled.Invoke("main", args...)
	if err != nil {
		return nil, err
	}
	oa, err := out.Array()
	if err != nil {
		return nil, err
	}
	kilnOut, err := ndarray.ToSlice[float32](oa)
	if err != nil {
		return nil, err
	}

	// The reference: the same weights and input through PyTorch.
	torchDir := filepath.Join(dir, "torch")
	if err := os.MkdirAll(torchDir, 0o755); err != nil {
		return nil, err
	}
	if err := ndarray.SaveNPY(filepath.Join(torchDir, "x.npy"), x); err != nil {
		return nil, err
	}
	for _, name := range params.Names() {
		if err := ndarray.SaveNPY(filepath.Join(torchDir, name+".npy"), ps[name]); err != nil {
			return nil, err
		}
	}

	invoke := func(m *load.Module, recycle bool) func() error {
		return func() error {
			out, err := m.Invoke("main", args...)
			if err != nil {
				return err
			}
			if recycle {
				m.VM().Recycle(out)
			}
			return nil
		}
	}
	var pooledUS, naiveUS, torchUS, pairs, pn []float64
	for i := 0; i < rounds; i++ {
		p, err := timeBatch(invoke(pooled, true), minBatch)
		if err != nil {
			return nil, err
		}
		nv, err := timeBatch(invoke(naive, false), minBatch)
		if err != nil {
			return nil, err
		}
		pooledUS, naiveUS = append(pooledUS, p), append(naiveUS, nv)
		pn = append(pn, p/nv)
		if r.NoReference != "" {
			continue
		}
		tr, err := runTorchMLP(ctx, torchDir, minBatch)
		if errors.Is(err, errNoReference) {
			r.NoReference = err.Error()
			continue
		}
		if err != nil {
			return nil, err
		}
		torchUS = append(torchUS, tr.US)
		pairs = append(pairs, p/tr.US)
		r.Torch = tr.Version
		if i == 0 {
			for j := range kilnOut {
				r.MaxAbsDiff = math.Max(r.MaxAbsDiff, math.Abs(float64(kilnOut[j])-tr.Out[j]))
			}
			if r.MaxAbsDiff > 1e-3 {
				return nil, fmt.Errorf("kiln's MLP output differs from PyTorch's by %g", r.MaxAbsDiff)
			}
		}
	}
	r.PooledUS, r.NaiveUS, r.PooledNaive = sig(median(pooledUS), 4), sig(median(naiveUS), 4), sig(median(pn), 4)
	if len(torchUS) > 0 {
		r.TorchUS, r.Ratio = sig(median(torchUS), 4), sig(median(pairs), 4)
	}
	return r, nil
}

// timeBatch runs f in batches until one lasts minBatch and returns
// microseconds per call.
func timeBatch(f func() error, minBatch time.Duration) (float64, error) {
	if err := f(); err != nil {
		return 0, err
	}
	n := 1
	for {
		start := time.Now()
		for range n {
			if err := f(); err != nil {
				return 0, err
			}
		}
		d := time.Since(start)
		if d >= minBatch {
			return float64(d.Microseconds()) / float64(n), nil
		}
		n = max(2*n, int(float64(n)*float64(minBatch)/float64(max(d, time.Microsecond)))+1)
	}
}

type torchResult struct {
	Version string    `json:"torch"`
	US      float64   `json:"us"`
	Out     []float64 `json:"out"`
}

// torchMLP times the same MLP in PyTorch eager mode with two threads.
const torchMLP = `
import json, sys, time
import numpy as np
import torch
torch.set_num_threads(2)
d, min_s = sys.argv[1], float(sys.argv[2])
ld = lambda n: torch.from_numpy(np.load(d + "/" + n + ".npy"))
m = torch.nn.Sequential(torch.nn.Linear(784, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
with torch.no_grad():
    m[0].weight.copy_(ld("fc1.weight")); m[0].bias.copy_(ld("fc1.bias"))
    m[2].weight.copy_(ld("fc2.weight")); m[2].bias.copy_(ld("fc2.bias"))
    x = ld("x")
    out = m(x)
    n = 1
    while True:
        t = time.perf_counter()
        for _ in range(n):
            m(x)
        dt = time.perf_counter() - t
        if dt >= min_s:
            break
        n = max(n * 2, int(n * min_s / max(dt, 1e-9)) + 1)
print(json.dumps({"torch": torch.__version__, "us": dt / n * 1e6, "out": out[0].tolist()}))
`

func runTorchMLP(ctx context.Context, dir string, minBatch time.Duration) (torchResult, error) {
	py := referencePython()
	if _, err := exec.LookPath(py); err != nil {
		return torchResult{}, fmt.Errorf("%w: %s not found", errNoReference, py)
	}
	cmd := exec.CommandContext(ctx, py, "-c", torchMLP, dir, fmt.Sprint(minBatch.Seconds()))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		msg := strings.TrimSpace(stderr.String())
		if strings.Contains(msg, "No module named") {
			return torchResult{}, fmt.Errorf("%w: %s lacks PyTorch or numpy (apt-get install python3-torch python3-numpy)", errNoReference, py)
		}
		return torchResult{}, fmt.Errorf("pytorch reference: %w: %s", err, msg)
	}
	var r torchResult
	if err := json.Unmarshal(out, &r); err != nil {
		return torchResult{}, fmt.Errorf("pytorch reference: bad output %q: %w", out, err)
	}
	return r, nil
}
