package cli

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"

	ucli "github.com/urfave/cli/v2"

	"github.com/kiln-ml/kiln/abi"
	"github.com/kiln-ml/kiln/artifact"
	"github.com/kiln-ml/kiln/devices"
	"github.com/kiln-ml/kiln/ndarray"
	"github.com/kiln-ml/kiln/packedfunc"
)

func runCommand() *ucli.Command {
	return &ucli.Command{
		Name:      "run",
		Usage:     "run one function of a .kiln artifact on .npy inputs",
		UsageText: "kiln run ARTIFACT --func NAME [--input NAME=FILE.npy]... [--arg NAME=VALUE]... [--allow-missing] [--output DIR] [--tracker HOST:PORT --key KEY]",
		Description: `Loads the artifact on this machine's CPU, reads each --input from a .npy file
and passes it as the parameter of that name, passes each --arg as a scalar
parameter, allocates the function's outputs (the tensors it writes; their
shapes from the function's signature, symbolic dimensions taken from the
inputs) zero-filled, calls the function once, and writes every output to
DIR/NAME.npy (an output given as an --input too starts from that file's
values). A tensor the function only reads must be given with --input: one
left out is an error naming it, unless --allow-missing passes zeros for it
(such a tensor is not written out).

With --tracker the call runs on a device leased from the tracker (by --key
or --selector): the artifact is uploaded to the device daemon, the inputs are
copied there, and the outputs are copied back.

An artifact built for cuda runs on this machine's first GPU (cuda:0, or the
one --device cuda:N names): the tensors are copied there before the call and
back after it; a graph module runs in the VM with its tensors on the GPU.
With --tracker it runs on a device daemon whose machine has a CUDA device new
enough for it: the lease asks for one (selector "device.cuda,cuda.compute>=8.0"
for sm_80, added to --selector), a --key none of whose devices has one is
refused at once (and, without --wait, a selector alone when no
registered device has one), and the daemon copies the tensors between host
and GPU.

Examples:
   kiln run vadd.kiln --func vadd --input A=a.npy --input B=b.npy --output out/
   kiln run vadd.kiln --func vadd --input A=a.npy --input B=b.npy --tracker 127.0.0.1:9190 --key cpu
   kiln run scale.kiln --func scale --input X=x.npy --arg alpha=0.5 --output out/
   kiln run mlp.kiln --input x=x.npy --tracker 127.0.0.1:9190 --key a100`,
		Flags: append(callFlags(),
			append([]ucli.Flag{
				&ucli.StringFlag{Name: "output", Value: ".", Usage: "directory for the outputs (created if missing)"},
				&ucli.BoolFlag{Name: "allow-missing", Usage: "pass zeros for tensor inputs not given with --input (they are not written out)"},
			}, remoteFlags()...)...),
		OnUsageError: usageError,
		Action:       runRun,
	}
}

func runRun(c *ucli.Context) error {
	path, a, fi, call, err := loadCall(c, "run")
	if err != nil {
		return err
	}
	r, err := openRunner(c, path, a, fi)
	if err != nil {
		return fmt.Errorf("run %s: %w", path, err)
	}
	defer r.close()
	ctx, cancel := stepContext(c)
	err = r.call(ctx, call)
	cancel()
	if err != nil {
		return fmt.Errorf("run %s: %w", path, err)
	}
	return writeOutputs(c, c.String("output"), call)
}

// loadCall reads the artifact, picks the function and prepares its
// arguments from --func, --input and --arg.
func loadCall(c *ucli.Context, cmd string) (string, *artifact.Artifact, abi.FuncInfo, *preparedCall, error) {
	if c.NArg() != 1 {
		return "", nil, abi.FuncInfo{}, nil, fmt.Errorf("%s: want one artifact file, got %d arguments (see \"kiln %s --help\")", cmd, c.NArg(), cmd)
	}
	path := c.Args().First()
	a, err := artifact.Load(path)
	if err != nil {
		return "", nil, abi.FuncInfo{}, nil, fmt.Errorf("%s: %w", cmd, err)
	}
	if _, ok := a.Files[artifact.VMExec]; ok {
		fi, call, err := prepareVMCall(a, c.String("func"), c.StringSlice("input"), c.String("params"))
		if err != nil {
			return "", nil, abi.FuncInfo{}, nil, fmt.Errorf("%s %s: %w", cmd, path, err)
		}
		return path, a, fi, call, nil
	}
	if c.String("params") != "" {
		return "", nil, abi.FuncInfo{}, nil, fmt.Errorf("%s %s: --params is for graph-level artifacts (with a VM executable); this one has kernels only", cmd, path)
	}
	fi, err := pickFunction(a, c.String("func"))
	if err != nil {
		return "", nil, abi.FuncInfo{}, nil, fmt.Errorf("%s %s: %w", cmd, path, err)
	}
	// Timing does not depend on the values: bench passes zeros for the
	// inputs left out; run wants them all, or --allow-missing.
	allowMissing := cmd == "bench" || c.Bool("allow-missing")
	call, err := prepareCall(fi, c.StringSlice("input"), c.StringSlice("arg"), allowMissing)
	if err != nil {
		return "", nil, abi.FuncInfo{}, nil, fmt.Errorf("%s %s: %w", cmd, path, err)
	}
	return path, a, fi, call, nil
}

// callFlags name the function and its arguments.
func callFlags() []ucli.Flag {
	return []ucli.Flag{
		&ucli.StringFlag{Name: "func", Usage: "the function to call (may be left out when the artifact has one)"},
		&ucli.StringSliceFlag{Name: "input", Usage: "NAME=FILE.npy: a tensor argument (repeatable)"},
		&ucli.StringSliceFlag{Name: "arg", Usage: "NAME=VALUE: a scalar argument, int or float (repeatable)"},
		&ucli.StringFlag{Name: "params", Usage: "safetensors file of named parameters (weights) for a graph-level artifact"},
		&ucli.StringFlag{Name: "memory-cfg", Value: "pooled", Usage: "VM allocator for a graph-level artifact: pooled or naive"},
		&ucli.StringFlag{Name: "device", Usage: "device to run on: cpu, cuda or cuda:N (default: the first of the kind the artifact is built for; with --tracker, the one the daemon gives the session)"},
	}
}

// runDevice is the device --device names for artifact a (the first of a's
// kind without it): a cuda artifact runs on a cuda device, any other on
// cpu:0, and through a tracker on the daemon's first device of the kind.
func runDevice(c *ucli.Context, a *artifact.Artifact) (devices.Device, error) {
	want := devices.CPUDevice
	if isCUDAArtifact(a) {
		want = devices.Device{Type: devices.CUDA, ID: 0}
	}
	flag := c.String("device")
	if flag == "" {
		return want, nil
	}
	dev, err := devices.ParseDevice(flag)
	if err != nil {
		return dev, fmt.Errorf("--device: %w", err)
	}
	switch {
	case dev.Type != want.Type:
		return dev, fmt.Errorf("--device %s: the artifact is built for %q, which runs on %s devices", flag, a.Manifest.Target, want.Type)
	case dev.Type == devices.CPU && dev.ID != 0:
		return dev, fmt.Errorf("--device %s: kiln runs cpu artifacts on cpu:0 (all its cores)", flag)
	case dev.ID != 0 && c.String("tracker") != "":
		return dev, fmt.Errorf("--device %s with --tracker: a session on a device daemon runs on one %s device, %s (the daemon picks which of its own it is)", flag, dev.Type, want)
	}
	return dev, nil
}

// pickFunction finds the function to call: the one named, or the only one.
func pickFunction(a *artifact.Artifact, name string) (abi.FuncInfo, error) {
	var names []string
	for _, f := range a.Manifest.Functions {
		names = append(names, f.Name)
	}
	if name == "" {
		if len(names) == 1 {
			return a.Manifest.Functions[0], nil
		}
		return abi.FuncInfo{}, fmt.Errorf("name the function with --func (the artifact has %s)", strings.Join(names, ", "))
	}
	fi, ok := a.Function(name)
	if !ok {
		return abi.FuncInfo{}, fmt.Errorf("no function %q in the artifact (it has %s)", name, strings.Join(names, ", "))
	}
	return fi, nil
}

// preparedCall is a call's arguments, in parameter order, and which tensor
// parameters are outputs (those the function writes).
type preparedCall struct {
	fn abi.FuncInfo
	// vm says the function is a graph function run by the VM: every
	// parameter is an input and the result is the output "output".
	vm      bool
	args    []packedfunc.Value
	arrays  map[string]*ndarray.NDArray
	outputs []string
	// returned is the scalar a function with a return value (fn.Ret)
	// returned, as text.
	returned string
}

// prepareCall reads the inputs, binds shapes and allocates the outputs
// not given. A tensor the function only reads must be an input, unless
// allowMissing: then it is zero-filled, and not an output.
func prepareCall(fi abi.FuncInfo, inputs, scalars []string, allowMissing bool) (*preparedCall, error) {
	arrays := map[string]*ndarray.NDArray{}
	shapes := map[string][]int64{}
	for _, in := range inputs {
		name, file, ok := strings.Cut(in, "=")
		if !ok || name == "" || file == "" {
			return nil, fmt.Errorf("--input %q: want NAME=FILE.npy", in)
		}
		if _, dup := arrays[name]; dup {
			return nil, fmt.Errorf("--input %q: %s given twice", in, name)
		}
		arr, err := ndarray.LoadNPY(file)
		if err != nil {
			return nil, fmt.Errorf("input %s: %w", name, err)
		}
		arrays[name], shapes[name] = arr, arr.Shape()
	}
	ints, floats := map[string]int64{}, map[string]float64{}
	kinds := map[string]string{}
	for _, p := range fi.Params {
		kinds[p.Name] = p.Kind
	}
	for _, s := range scalars {
		name, val, ok := strings.Cut(s, "=")
		if !ok || name == "" || val == "" {
			return nil, fmt.Errorf("--arg %q: want NAME=VALUE", s)
		}
		switch kinds[name] {
		case abi.ParamInt:
			n, err := strconv.ParseInt(val, 0, 64)
			if err != nil {
				return nil, fmt.Errorf("--arg %s: %q is not an integer", name, val)
			}
			ints[name] = n
		case abi.ParamFloat:
			x, err := strconv.ParseFloat(val, 64)
			if err != nil {
				return nil, fmt.Errorf("--arg %s: %q is not a number", name, val)
			}
			floats[name] = x
		case "":
			return nil, fmt.Errorf("--arg %s: %s has no parameter of that name", name, fi.Name)
		default:
			return nil, fmt.Errorf("--arg %s: parameter %s is a %s; pass tensors with --input", name, name, kinds[name])
		}
	}
	outputs := fi.Outputs()
	var missing, flags []string
	for _, p := range fi.Params {
		if _, given := arrays[p.Name]; p.Kind == abi.ParamTensor && !given && !slices.Contains(outputs, p.Name) {
			missing = append(missing, strconv.Quote(p.Name))
			flags = append(flags, "--input "+p.Name+"=FILE.npy")
		}
	}
	if len(missing) > 0 && !allowMissing {
		for name := range arrays {
			if kinds[name] == "" {
				return nil, fmt.Errorf("--input %s: %s has no parameter of that name (parameters: %s)", name, fi.Name, paramNames(fi))
			}
		}
		what, it := "tensor parameter "+missing[0]+" is", "it"
		if len(missing) > 1 {
			what, it = "tensor parameters "+strings.Join(missing, ", ")+" are", "them"
		}
		return nil, fmt.Errorf("%s: %s not given and the function only reads %s: pass %s (or --allow-missing to pass zeros)", fi.Name, what, it, strings.Join(flags, " "))
	}
	all, err := fi.Bind(shapes, ints)
	if err != nil {
		return nil, err
	}
	call := &preparedCall{fn: fi, arrays: arrays}
	for _, p := range fi.Params {
		switch p.Kind {
		case abi.ParamTensor:
			arr, given := arrays[p.Name]
			if given {
				if p.DType != "" && arr.DType().String() != p.DType {
					return nil, fmt.Errorf("input %s: dtype %s, %s wants %s", p.Name, arr.DType(), fi.Name, p.DType)
				}
				if slices.Contains(outputs, p.Name) {
					call.outputs = append(call.outputs, p.Name)
				}
			} else {
				if p.DType == "" {
					return nil, fmt.Errorf("parameter %s has no declared dtype; give it with --input", p.Name)
				}
				dt, err := ndarray.ParseDType(p.DType)
				if err != nil {
					return nil, fmt.Errorf("parameter %s: %w", p.Name, err)
				}
				arr, err = ndarray.Zeros(all[p.Name], dt, devices.CPUDevice)
				if err != nil {
					return nil, fmt.Errorf("allocate %s: %w", p.Name, err)
				}
				arrays[p.Name] = arr
				if slices.Contains(outputs, p.Name) {
					call.outputs = append(call.outputs, p.Name)
				}
			}
			call.args = append(call.args, packedfunc.Array(arr))
		case abi.ParamInt:
			n, ok := ints[p.Name]
			if !ok {
				return nil, fmt.Errorf("parameter %s (int) not given: pass --arg %s=VALUE", p.Name, p.Name)
			}
			call.args = append(call.args, packedfunc.Int(n))
		case abi.ParamFloat:
			x, ok := floats[p.Name]
			if !ok {
				return nil, fmt.Errorf("parameter %s (float) not given: pass --arg %s=VALUE", p.Name, p.Name)
			}
			call.args = append(call.args, packedfunc.Float(x))
		default:
			call.args = append(call.args, packedfunc.Nil)
		}
	}
	return call, nil
}

// paramNames lists fi's parameters, comma-separated.
func paramNames(fi abi.FuncInfo) string {
	var names []string
	for _, p := range fi.Params {
		names = append(names, p.Name)
	}
	return strings.Join(names, ", ")
}

// setOutputs records a graph function's results: one tensor is "output",
// the tensors of a tuple (flattened in order) are "out_0", "out_1", ….
func (call *preparedCall) setOutputs(outs []*ndarray.NDArray) {
	call.outputs = call.outputs[:0]
	if len(outs) == 1 {
		call.arrays["output"], call.outputs = outs[0], append(call.outputs, "output")
		return
	}
	for i, a := range outs {
		name := fmt.Sprintf("out_%d", i)
		call.arrays[name] = a
		call.outputs = append(call.outputs, name)
	}
}

// writeOutputs saves every output array as DIR/NAME.npy and lists them.
func writeOutputs(c *ucli.Context, dir string, call *preparedCall) error {
	if call.fn.Ret != "" {
		fmt.Fprintf(c.App.Writer, "%s returned %s (%s)\n", call.fn.Name, call.returned, call.fn.Ret)
	}
	if len(call.outputs) == 0 {
		if call.fn.Ret == "" {
			fmt.Fprintf(c.App.Writer, "%s: no outputs (the function writes none of its tensors)\n", call.fn.Name)
		}
		return nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("output directory: %w", err)
	}
	tw := tabwriter.NewWriter(c.App.Writer, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "OUTPUT\tDTYPE\tSHAPE\tFILE")
	var errs []error
	names := call.outputs // a graph function's, in result order
	if !call.vm {
		names = slices.Sorted(slices.Values(call.outputs))
	}
	for _, name := range names {
		arr := call.arrays[name]
		p := filepath.Join(dir, name+".npy")
		if err := ndarray.SaveNPY(p, arr); err != nil {
			errs = append(errs, fmt.Errorf("write %s: %w", name, err))
			continue
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", name, arr.DType(), arr.Shape(), p)
	}
	tw.Flush()
	return errors.Join(errs...)
}
