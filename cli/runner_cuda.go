package cli

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"unicode"

	"github.com/kiln-ml/kiln/abi"
	"github.com/kiln-ml/kiln/artifact"
	"github.com/kiln-ml/kiln/devices"
	"github.com/kiln-ml/kiln/devices/cuda"
	"github.com/kiln-ml/kiln/load"
	_ "github.com/kiln-ml/kiln/load/cudaload" // cuda artifacts load
	"github.com/kiln-ml/kiln/ndarray"
	"github.com/kiln-ml/kiln/packedfunc"
	"github.com/kiln-ml/kiln/rpcserver/proto"
	"github.com/kiln-ml/kiln/rpcserver/timer"
)

// cudaCompute is the compute capability a cuda artifact's device code
// needs, "8.0" for sm_80 (newer devices run it too).
func cudaCompute(a *artifact.Artifact) (string, error) {
	mj, ok := a.Files[abi.DeviceMetadataName]
	if !ok {
		return "", fmt.Errorf("the artifact is built for %q and has no %s", a.Manifest.Target, abi.DeviceMetadataName)
	}
	meta, err := abi.ParseDeviceMetadata(mj)
	if err != nil {
		return "", err
	}
	n, err := strconv.Atoi(strings.TrimRightFunc(strings.TrimPrefix(meta.Arch, "sm_"), unicode.IsLetter))
	if err != nil || !strings.HasPrefix(meta.Arch, "sm_") {
		return "", fmt.Errorf("the artifact's device code is built for %q, not a cuda architecture (sm_XY)", meta.Arch)
	}
	return fmt.Sprintf("%d.%d", n/10, n%10), nil
}

// cudaSelector is the selector of the devices that run a cuda artifact
// needing compute capability need: daemons on a machine with a CUDA device
// at least that new.
func cudaSelector(need string) string { return "device.cuda,cuda.compute>=" + need }

// cudaKey fails at once when devices are registered under key and none of
// them has a CUDA device of compute capability need or newer: an artifact
// built for target cannot run there, and waiting would not change that.
// Without a key (a selector alone), it fails when no registered device
// has one and the client would not wait for one to register.
func cudaKey(sum proto.TrackerSummary, key, target, need string, wait bool) error {
	needCC, _ := strconv.ParseFloat(need, 64)
	types, computes := map[string]bool{}, map[string]bool{}
	for _, d := range sum.Devices {
		if key != "" && d.Key != key {
			continue
		}
		if slices.Contains(d.Attrs.DeviceTypes, devices.CUDA.String()) {
			if cc, err := strconv.ParseFloat(d.Attrs.CUDACompute, 64); err == nil && cc >= needCC {
				return nil
			}
			computes[d.Attrs.CUDACompute] = true
		}
		for _, t := range d.Attrs.DeviceTypes {
			types[t] = true
		}
	}
	where := fmt.Sprintf("under key %q", key)
	if key == "" {
		if wait {
			return nil
		}
		where = "registered with the tracker"
	} else if len(types) == 0 {
		return nil // none registered: the lease waits, or knownKey says so
	}
	list := func(m map[string]bool) string { return strings.Join(slices.Sorted(maps.Keys(m)), ", ") }
	switch {
	case len(computes) > 0:
		return fmt.Errorf("the artifact is built for %q and needs a GPU of compute capability %s or newer, and the cuda devices %s have %s: %w",
			target, need, where, list(computes), proto.ErrNotFound)
	case key == "":
		have := "no device is registered"
		if len(types) > 0 {
			have = "the registered devices serve " + list(types)
		}
		return fmt.Errorf("the artifact is built for %q, and no device registered with the tracker has a cuda device (%s); pass --wait DURATION to wait for one: %w", target, have, proto.ErrNotFound)
	}
	return fmt.Errorf("the artifact is built for %q, and no device under key %q has a cuda device (they serve %s): lease a key whose daemons run on a machine with an NVIDIA GPU: %w",
		target, key, list(types), proto.ErrNotFound)
}

// isCUDAArtifact reports an artifact built for a cuda target.
func isCUDAArtifact(a *artifact.Artifact) bool {
	kind, _, _ := strings.Cut(a.Manifest.Target, " ")
	return kind == "cuda"
}

// cudaRunner runs a function of a cuda artifact on one of this machine's
// GPUs (the first unless --device says): tensors are copied to the GPU before the call and back after it. A
// graph module runs in the VM on the GPU: its storage is allocated there,
// its bundled constants copied there once when it loads, and the tensors
// of its result copied back.
type cudaRunner struct {
	dev devices.Device
	mod *load.Module
	f   *packedfunc.Func
}

func openCUDA(a *artifact.Artifact, fi abi.FuncInfo, memoryCfg string, dev devices.Device) (*cudaRunner, error) {
	mod, err := load.Artifact(a, load.Options{Device: dev, MemoryCfg: memoryCfg})
	if err != nil {
		return nil, err
	}
	r := &cudaRunner{dev: dev, mod: mod}
	if r.f, err = mod.GetFunction(fi.Name); err != nil {
		r.close()
		return nil, err
	}
	return r, nil
}

// toDevice copies the call's tensors to the GPU; done releases them.
func (r *cudaRunner) toDevice(call *preparedCall) (args []packedfunc.Value, dev map[*ndarray.NDArray]*ndarray.NDArray, err error) {
	dev = map[*ndarray.NDArray]*ndarray.NDArray{}
	args = make([]packedfunc.Value, len(call.args))
	for i, v := range call.args {
		h, aerr := v.AsArray()
		if aerr != nil {
			args[i] = v
			continue
		}
		b, berr := h.Bytes()
		if berr != nil {
			r.release(dev)
			return nil, nil, berr
		}
		d, derr := ndarray.FromBytes(b, h.Shape(), h.DType(), r.dev)
		if derr != nil {
			r.release(dev)
			return nil, nil, fmt.Errorf("copy to %s: %w", r.dev, derr)
		}
		dev[h] = d
		args[i] = packedfunc.Array(d)
	}
	return args, dev, nil
}

func (r *cudaRunner) release(dev map[*ndarray.NDArray]*ndarray.NDArray) {
	for _, d := range dev {
		_ = d.Release()
	}
}

func (r *cudaRunner) call(_ context.Context, call *preparedCall) error {
	args, dev, err := r.toDevice(call)
	if err != nil {
		return err
	}
	defer r.release(dev)
	res, err := r.f.Call(args...)
	if err != nil {
		return err
	}
	if call.vm {
		return r.vmOutputs(call, res)
	}
	// Copying back waits for the kernels (the default stream).
	for _, name := range call.outputs {
		h := call.arrays[name]
		d, ok := dev[h]
		if !ok {
			continue
		}
		b, err := d.Bytes()
		if err != nil {
			return fmt.Errorf("copy %s back from %s: %w", name, r.dev, err)
		}
		out, err := ndarray.FromBytes(b, h.Shape(), h.DType(), devices.CPUDevice)
		if err != nil {
			return err
		}
		call.arrays[name] = out
	}
	return nil
}

// time runs the time evaluator with the tensors on the GPU (copied once),
// measuring each repeat between two events on the default stream.
func (r *cudaRunner) time(ctx context.Context, call *preparedCall, o proto.TimeOptions) (proto.TimeResult, error) {
	if o.CacheFlushBytes > 0 {
		return proto.TimeResult{}, errors.New("--cache-flush-bytes is not supported on cuda")
	}
	args, dev, err := r.toDevice(call)
	if err != nil {
		return proto.TimeResult{}, err
	}
	defer r.release(dev)
	api, err := devices.Get(devices.CUDA)
	if err != nil {
		return proto.TimeResult{}, err
	}
	tm, err := cuda.NewEventTimer(r.dev)
	if err != nil {
		return proto.TimeResult{}, err
	}
	defer tm.Close()
	ev := timer.Evaluator{
		Call:  func() error { _, err := r.f.Call(args...); return err },
		Sync:  func() error { return api.StreamSync(r.dev, 0) },
		Timer: tm,
	}
	res, err := ev.Evaluate(ctx, timer.OptionsOf(o))
	if err != nil {
		return proto.TimeResult{}, err
	}
	return res.Wire(r.dev.String()), nil
}

// vmOutputs copies the tensors of a graph function's result back from the
// GPU (which waits for its kernels) as the call's outputs.
func (r *cudaRunner) vmOutputs(call *preparedCall, res packedfunc.Value) error {
	outs, err := resultArrays(call, res)
	if err != nil {
		return err
	}
	host := make([]*ndarray.NDArray, len(outs))
	for i, d := range outs {
		b, err := d.Bytes()
		if err != nil {
			return fmt.Errorf("copy output %d back from %s: %w", i, r.dev, err)
		}
		if host[i], err = ndarray.FromBytes(b, d.Shape(), d.DType(), devices.CPUDevice); err != nil {
			return err
		}
	}
	call.setOutputs(host)
	return nil
}

func (r *cudaRunner) profile(_ context.Context, call *preparedCall, rounds int) (*load.Profile, error) {
	return r.mod.Profile(call.fn.Name, rounds, call.args...)
}

func (r *cudaRunner) where() string { return "this machine (" + r.dev.String() + ")" }

func (r *cudaRunner) close() { r.mod.Close() }
