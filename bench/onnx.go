package main

import (
	"cmp"
	"context"
	_ "embed"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/kiln-ml/kiln/compiler"
	"github.com/kiln-ml/kiln/compiler/frontend/onnx"
	"github.com/kiln-ml/kiln/devices/cpu"
	"github.com/kiln-ml/kiln/load"
	"github.com/kiln-ml/kiln/ndarray"
	"github.com/kiln-ml/kiln/packedfunc"
	"github.com/kiln-ml/kiln/vm"
)

//go:embed onnx_export.py
var onnxExportScript string

//go:embed onnx_ort.js
var onnxORTScript string

func init() {
	register(benchmark{
		name: "onnx",
		summary: "ONNX models (resnet18, mobilenet_v2, squeezenet1_1, a TransformerEncoderLayer) exported from PyTorch: " +
			"kiln's latency (batch 1, fp32, 2 threads) against ONNX Runtime and PyTorch, and kiln's max abs diff from PyTorch",
		run: runONNX,
	})
}

// onnxModels are the models bench onnx runs: torchvision classifiers
// (residual, inverted-residual with ReLU6, fire modules; squeeze-excitation
// with hard-swish, with SiLU; channel shuffle; LayerNorm with GELU) and two
// transformer encoder layers (post-norm ReLU; pre-norm GELU with a causal
// attention mask).
var onnxModels = []string{"resnet18", "mobilenet_v2", "squeezenet1_1", "transformer",
	"mobilenet_v3_small", "efficientnet_b0", "shufflenet_v2_x1_0", "convnext_tiny", "transformer_masked"}

// onnxModelResult is one model's figures; latencies are medians in ms.
type onnxModelResult struct {
	Model   string  `json:"model"`
	KilnMS  float64 `json:"kiln_ms"`
	ORTMS   float64 `json:"ort_ms,omitempty"`
	TorchMS float64 `json:"torch_ms,omitempty"`
	VsORT   float64 `json:"kiln_vs_ort,omitempty"` // kiln / ONNX Runtime; goal ≤ 1.0
	// VsORTPairs are the ratios of each pair of timings, kiln's rounds
	// then ONNX Runtime's, one pair after the other (ortPairs of them):
	// VsORT is their median, KilnMS and ORTMS the medians of each side's,
	// so that a machine whose speed drifts between the two sides of one
	// pair does not decide the ratio.
	VsORTPairs []float64 `json:"kiln_vs_ort_pairs,omitempty"`
	VsTorch    float64   `json:"kiln_vs_torch,omitempty"` // kiln / PyTorch
	MaxAbsDiff float64   `json:"max_abs_diff_vs_torch"`
	// RelDiff is MaxAbsDiff over the largest |output| of PyTorch.
	RelDiff    float64 `json:"rel_diff_vs_torch"`
	ORTDiff    float64 `json:"max_abs_diff_ort_vs_torch,omitempty"`
	BuildS     float64 `json:"build_s"`
	Kernels    int     `json:"kernels"`
	WeightsMiB float64 `json:"weights_mib"`
	// Contention is the model timed beside CPU-bound processes
	// (--contention).
	Contention []contentionResult `json:"contention,omitempty"`
	// remote is what the sessions2 condition uploads to a daemon.
	remote *remoteSpec
}

type onnxResult struct {
	Name        string            `json:"name"`
	Threads     int               `json:"threads"`
	Rounds      int               `json:"rounds"`
	Models      []onnxModelResult `json:"models"`
	KilnMS      float64           `json:"kiln_ms"` // the first model's, the headline
	NoORT       string            `json:"no_ort,omitempty"`
	NoTorch     string            `json:"no_torch,omitempty"`
	GoalVsORT   float64           `json:"goal_vs_ort"`
	Quick       bool              `json:"quick,omitempty"`
	Environment string            `json:"environment"`
	Target      string            `json:"target"` // what kiln built for (--target)
	ISA         string            `json:"isa"`    // the vector ISA of kiln's code; ONNX Runtime picks its own from the host's CPU
}

func (r onnxResult) Line() string {
	var parts []string
	for _, m := range r.Models {
		s := fmt.Sprintf("%s kiln %.2f ms", m.Model, m.KilnMS)
		if m.ORTMS > 0 {
			s += fmt.Sprintf(", ORT %.2f ms (×%.2f)", m.ORTMS, m.VsORT)
		}
		if m.TorchMS > 0 {
			s += fmt.Sprintf(", PyTorch %.2f ms (×%.2f)", m.TorchMS, m.VsTorch)
		}
		s += fmt.Sprintf(", max |kiln − torch| %.2g (rel %.2g)", m.MaxAbsDiff, m.RelDiff)
		s += contentionLine(m.Contention)
		parts = append(parts, s)
	}
	line := fmt.Sprintf("onnx (kiln %s, %s; ONNX Runtime: the host's ISA): ", r.Target, r.ISA) + strings.Join(parts, "; ")
	if r.NoORT != "" {
		line += "; no ONNX Runtime: " + r.NoORT
	}
	if r.NoTorch != "" {
		line += "; no PyTorch: " + r.NoTorch
	}
	return line
}

// benchCacheDir holds exported models and the ONNX Runtime package.
func benchCacheDir() (string, error) {
	d, err := os.UserCacheDir()
	if err != nil {
		return "", err
	}
	d = filepath.Join(d, "kiln", "bench-onnx")
	return d, os.MkdirAll(d, 0o755)
}

// exportModels runs the embedded PyTorch script: for each model it writes
// NAME.onnx, NAME_x.bin / NAME_y.bin (raw float32 input and PyTorch's
// output), and prints PyTorch's median latency per model as JSON.
func exportModels(ctx context.Context, dir string, models []string, rounds int) (map[string]float64, error) {
	script := filepath.Join(dir, "export.py")
	if err := os.WriteFile(script, []byte(onnxExportScript), 0o644); err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, referencePython(), script, dir, strings.Join(models, ","), fmt.Sprint(rounds))
	cmd.Env = append(os.Environ(), "OMP_NUM_THREADS=2")
	out, err := cmd.Output()
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			return nil, fmt.Errorf("%v: %s", err, lastLines(string(ee.Stderr), 3))
		}
		return nil, err
	}
	var ms map[string]float64
	if err := json.Unmarshal(out, &ms); err != nil {
		return nil, fmt.Errorf("export script printed %q: %w", lastLines(string(out), 2), err)
	}
	return ms, nil
}

func lastLines(s string, n int) string {
	ls := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(ls[max(0, len(ls)-n):], " | ")
}

// ortDir installs onnxruntime-node (npm, --ignore-scripts: the CPU
// library ships inside the package) into the cache once.
func ortDir(ctx context.Context, cache string) (string, error) {
	dir := filepath.Join(cache, "ort")
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "onnxruntime-node")); err == nil {
		return dir, nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	cmd := exec.CommandContext(ctx, "npm", "install", "--prefix", dir, "onnxruntime-node", "--ignore-scripts", "--no-audit", "--no-fund")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("npm install onnxruntime-node: %v: %s", err, lastLines(string(out), 2))
	}
	return dir, nil
}

// runORT times the model in ONNX Runtime (2 intra-op threads, all graph
// optimizations) and returns its median latency and output.
func runORT(ctx context.Context, ort, model, x string, shape []int64, rounds int) (float64, []float32, error) {
	if err := os.WriteFile(ortScript(ort), []byte(onnxORTScript), 0o644); err != nil {
		return 0, nil, err
	}
	outFile := model + ".ort.bin"
	cmd := ortCommand(ctx, ort, model, x, shape, outFile, rounds)
	out, err := cmd.Output()
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			return 0, nil, fmt.Errorf("%v: %s", err, lastLines(string(ee.Stderr), 3))
		}
		return 0, nil, err
	}
	var r struct {
		MedianMS float64 `json:"median_ms"`
	}
	if err := json.Unmarshal(out, &r); err != nil {
		return 0, nil, fmt.Errorf("ONNX Runtime script printed %q: %w", lastLines(string(out), 2), err)
	}
	y, err := readF32(outFile)
	return r.MedianMS, y, err
}

// ortScript is where runORT writes the ONNX Runtime timing script.
func ortScript(ort string) string { return filepath.Join(ort, "bench.js") }

func readF32(path string) ([]float32, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	out := make([]float32, len(b)/4)
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return out, nil
}

func runONNX(ctx context.Context, opt options) (result, error) {
	// Kernels' parallel loops run on kiln's pool of two threads, like the
	// peers (set before the first module loads, which sizes the pool).
	os.Setenv(cpu.EnvThreads, "2")
	rounds := 100
	r := onnxResult{Name: "onnx", Threads: 2, GoalVsORT: 1.0, Quick: opt.quick,
		Environment: "kiln: default schedules, no tuning; ONNX Runtime: onnxruntime-node, 2 intra-op threads, all graph optimizations; PyTorch eager, 2 threads"}
	target, err := benchTarget(opt.target)
	if err != nil {
		return nil, err
	}
	r.Target, r.ISA = target.String(), targetISA(target)
	models := onnxModels
	switch {
	case opt.quick:
		models, rounds = []string{"smallcnn"}, 3
	case opt.model != "" && opt.model != "all":
		models = strings.Split(opt.model, ",")
		for _, m := range models {
			if !strings.Contains(strings.Join(onnxModels, ","), m) {
				return nil, fmt.Errorf("--model %q: want one of %s or all", m, strings.Join(onnxModels, ", "))
			}
		}
	}
	r.Rounds = rounds
	cache, err := benchCacheDir()
	if err != nil {
		return nil, err
	}
	var torchMS map[string]float64
	if opt.quick {
		r.NoTorch, r.NoORT = "quick mode runs the committed test model without peers", "quick mode"
	} else if torchMS, err = exportModels(ctx, cache, models, rounds); err != nil {
		return nil, fmt.Errorf("export the models with PyTorch (python3-torch, python3-torchvision): %w", err)
	}
	ort := ""
	if !opt.quick {
		if ort, err = ortDir(ctx, cache); err != nil {
			r.NoORT = err.Error()
		}
	}
	for _, name := range models {
		mr, timeKiln, done, err := benchONNXModel(ctx, cache, name, target, rounds, opt.quick, opt.kernels)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		var timeORT func() (float64, error)
		if ort != "" {
			model := filepath.Join(cache, name+".onnx")
			shape := ortShape(name)
			timeORT = func() (float64, error) {
				ms, _, err := runORT(ctx, ort, model, filepath.Join(cache, name+"_x.bin"), shape, rounds)
				return ms, err
			}
			ms, y, err := runORT(ctx, ort, model, filepath.Join(cache, name+"_x.bin"), shape, rounds)
			if err != nil {
				timeORT = nil
				r.NoORT = err.Error()
			} else {
				if want, err := readF32(filepath.Join(cache, name+"_y.bin")); err == nil {
					mr.ORTDiff, _ = maxDiff(y, want)
				}
				if err := mr.pairWithORT(ms, rounds, timeKiln, timeORT); err != nil {
					done()
					return nil, fmt.Errorf("%s: %w", name, err)
				}
			}
		}
		// Against kiln's median, of the pairs with ONNX Runtime when timed.
		if ms, ok := torchMS[name]; ok && ms > 0 {
			mr.TorchMS, mr.VsTorch = ms, mr.KilnMS/ms
		}
		if opt.contention && err == nil {
			mr.Contention, err = measureContention(ctx, rounds, timeKiln, timeORT)
			if err == nil {
				var ortBusy func() (func(), error)
				if timeORT != nil {
					ortBusy = func() (func(), error) {
						return startORTBusy(ctx, ort, filepath.Join(cache, name+".onnx"), filepath.Join(cache, name+"_x.bin"), ortShape(name))
					}
				}
				var c contentionResult
				if c, err = measureSessions(ctx, rounds, mr.remote, ortBusy, timeORT); err == nil {
					mr.Contention = append(mr.Contention, c)
				} else {
					err = fmt.Errorf("contention sessions2: %w", err)
				}
			}
		}
		done()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		r.Models = append(r.Models, mr)
	}
	if len(r.Models) > 0 {
		r.KilnMS = r.Models[0].KilnMS
	}
	return r, nil
}

// ortPairs is how many pairs of kiln's and ONNX Runtime's timings give a
// model's ratio.
const ortPairs = 3

// pairWithORT times kiln and ONNX Runtime one after the other until
// there are ortPairs pairs (the first is kiln's timing so far and
// ortMS), and sets the medians and the ratio from them.
func (mr *onnxModelResult) pairWithORT(ortMS float64, rounds int, timeKiln func(int) ([]float64, error), timeORT func() (float64, error)) error {
	kiln, ortS := []float64{mr.KilnMS}, []float64{ortMS}
	for len(kiln) < ortPairs {
		ts, err := timeKiln(rounds)
		if err != nil {
			return fmt.Errorf("kiln, pair %d: %w", len(kiln)+1, err)
		}
		ms, err := timeORT()
		if err != nil {
			return fmt.Errorf("ONNX Runtime, pair %d: %w", len(kiln)+1, err)
		}
		kiln, ortS = append(kiln, median(ts)), append(ortS, ms)
	}
	mr.VsORTPairs = nil
	for i := range kiln {
		mr.VsORTPairs = append(mr.VsORTPairs, kiln[i]/ortS[i])
	}
	mr.KilnMS, mr.ORTMS, mr.VsORT = median(kiln), median(ortS), median(slices.Clone(mr.VsORTPairs))
	return nil
}

func maxDiff(got, want []float32) (abs, scale float64) {
	for i := range want {
		if i < len(got) {
			abs = math.Max(abs, math.Abs(float64(got[i]-want[i])))
		}
		scale = math.Max(scale, math.Abs(float64(want[i])))
	}
	if len(got) != len(want) {
		abs = math.Inf(1)
	}
	return abs, scale
}

// benchONNXModel imports, builds and times one model; the input and
// PyTorch's output come from the export (or the committed test data in
// quick mode).
//
// It also returns a function that times rounds more inferences (the
// milliseconds of each) and one that releases the model.
func benchONNXModel(ctx context.Context, cache, name string, target compiler.Target, rounds int, quick bool, perKernel io.Writer) (mr onnxModelResult, timeKiln func(rounds int) ([]float64, error), done func(), err error) {
	var cleanup []func()
	done = func() {
		for i := len(cleanup) - 1; i >= 0; i-- {
			cleanup[i]()
		}
	}
	defer func() {
		if err != nil {
			done()
		}
	}()
	mr, err = loadONNXModel(ctx, cache, name, target, rounds, quick, perKernel, &timeKiln, &cleanup)
	return mr, timeKiln, done, err
}

func loadONNXModel(ctx context.Context, cache, name string, target compiler.Target, rounds int, quick bool, perKernel io.Writer, timeKiln *func(int) ([]float64, error), cleanup *[]func()) (onnxModelResult, error) {
	mr := onnxModelResult{Model: name}
	model := filepath.Join(cache, name+".onnx")
	var x *ndarray.NDArray
	var want []float32
	opts := onnx.Options{}
	var err error
	if quick {
		td := filepath.Join("compiler", "frontend", "onnx", "testdata")
		if _, err := os.Stat(td); err != nil {
			td = filepath.Join("..", td)
		}
		model = filepath.Join(td, "smallcnn.onnx")
		if x, err = ndarray.LoadNPY(filepath.Join(td, "smallcnn_x.npy")); err != nil {
			return mr, err
		}
		y, err := ndarray.LoadNPY(filepath.Join(td, "smallcnn_y.npy"))
		if err != nil {
			return mr, err
		}
		if want, err = ndarray.ToSlice[float32](y); err != nil {
			return mr, err
		}
		opts.InputShapes = map[string][]int64{"x": {2, 3, 16, 16}}
	} else {
		shape := ndarray.Shape(ortShape(name))
		xs, err := readF32(filepath.Join(cache, name+"_x.bin"))
		if err != nil {
			return mr, err
		}
		if x, err = ndarray.FromSlice(xs, shape); err != nil {
			return mr, err
		}
		if want, err = readF32(filepath.Join(cache, name+"_y.bin")); err != nil {
			return mr, err
		}
	}
	start := time.Now()
	mod, weights, err := onnx.ImportFile(model, opts)
	if err != nil {
		return mr, err
	}
	mr.WeightsMiB = float64(len(weights)) / (1 << 20)
	a, err := compiler.Build(ctx, mod, target, compiler.BuildOptions{Params: weights})
	if err != nil {
		return mr, err
	}
	mr.BuildS = time.Since(start).Seconds()
	mr.Kernels = len(a.Manifest.Functions)
	m, err := load.Artifact(a, load.Options{MemoryCfg: vm.MemoryPooled, Profile: perKernel != nil})
	if err != nil {
		return mr, err
	}
	*cleanup = append(*cleanup, func() { m.Close() })
	args := []packedfunc.Value{packedfunc.Array(x)} // the weights are bundled
	ab, err := a.Bytes()
	if err != nil {
		return mr, err
	}
	mr.remote = &remoteSpec{artifact: ab, args: []*ndarray.NDArray{x}}
	var got []float32
	var times []float64
	for i := range rounds + 2 {
		t0 := time.Now()
		out, err := m.Invoke("main", args...)
		if err != nil {
			return mr, err
		}
		if i >= 2 {
			times = append(times, float64(time.Since(t0))/1e6)
		} else if i == 1 {
			m.VM().ResetProfile() // the warm-up calls' times (first-call repacks) are not the model's
		}
		oa, err := out.Array()
		if err != nil {
			return mr, err
		}
		if got, err = ndarray.ToSlice[float32](oa); err != nil {
			return mr, err
		}
	}
	mr.KilnMS = median(times)
	*timeKiln = func(rounds int) ([]float64, error) {
		ts := make([]float64, 0, rounds)
		for range rounds {
			t0 := time.Now()
			if _, err := m.Invoke("main", args...); err != nil {
				return nil, err
			}
			ts = append(ts, float64(time.Since(t0))/1e6)
		}
		return ts, nil
	}
	if perKernel != nil {
		printKernelTimes(perKernel, name, m.VM().Profile(), rounds)
	}
	var scale float64
	mr.MaxAbsDiff, scale = maxDiff(got, want)
	if scale > 0 {
		mr.RelDiff = mr.MaxAbsDiff / scale
	}
	return mr, nil
}

// printKernelTimes writes a model's kernel times per call of the model,
// the most expensive first: the median call's time times the calls per
// inference (steady under load), the mean, and each kernel's share of the
// sum of the medians.
func printKernelTimes(w io.Writer, model string, p []vm.KernelTime, rounds int) {
	if rounds == 0 {
		return
	}
	perInference := func(k vm.KernelTime) float64 {
		return float64(k.Median) * float64(k.Calls/int64(rounds)) / 1e3
	}
	var total, mean float64
	for _, k := range p {
		total += perInference(k)
		mean += float64(k.Total) / float64(rounds) / 1e3
	}
	if total == 0 {
		return
	}
	slices.SortStableFunc(p, func(a, b vm.KernelTime) int { return cmp.Compare(perInference(b), perInference(a)) })
	fmt.Fprintf(w, "%s: kernel time per inference %.3f ms (sum of medians; of means %.3f ms) over %d kernels\n", model, total/1e3, mean/1e3, len(p))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "µs/inference\tmean\tshare\tcalls/inference\tkernel\t\n")
	for _, k := range p {
		fmt.Fprintf(tw, "%.1f\t%.1f\t%.1f%%\t%d\t%s\t\n", perInference(k), float64(k.Total)/float64(rounds)/1e3, 100*perInference(k)/total, k.Calls/int64(rounds), k.Name)
	}
	tw.Flush()
}
