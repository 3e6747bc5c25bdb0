package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	ucli "github.com/urfave/cli/v2"

	"github.com/kiln-ml/kiln/abi"
	"github.com/kiln-ml/kiln/artifact"
	"github.com/kiln-ml/kiln/client"
	"github.com/kiln-ml/kiln/devices"
	"github.com/kiln-ml/kiln/devices/cpu"
	"github.com/kiln-ml/kiln/load"
	"github.com/kiln-ml/kiln/ndarray"
	"github.com/kiln-ml/kiln/packedfunc"
	"github.com/kiln-ml/kiln/rpcserver/proto"
	"github.com/kiln-ml/kiln/rpcserver/timer"
)

// runner calls and times one function of an artifact, on this machine or
// on a leased remote device.
type runner interface {
	// call runs the function once; afterwards call.arrays holds the
	// outputs' values.
	call(ctx context.Context, call *preparedCall) error
	// time runs the time evaluator on the function with call's arguments.
	time(ctx context.Context, call *preparedCall, o proto.TimeOptions) (proto.TimeResult, error)
	// profile times each kernel of graph function call.fn over rounds
	// inferences, where the function runs.
	profile(ctx context.Context, call *preparedCall, rounds int) (*load.Profile, error)
	// where names the device for the output.
	where() string
	close()
}

// remoteFlags are the flags of commands that can run on a leased device.
func remoteFlags() []ucli.Flag {
	return append([]ucli.Flag{
		trackerFlag("HOST:PORT of a tracker: run on a device leased from it (default: this machine)", false),
		&ucli.StringFlag{Name: "key", Usage: "with --tracker: the device key to lease"},
		&ucli.StringFlag{Name: "selector", Usage: "with --tracker: attribute selector, e.g. \"cpu.avx512=true\""},
		&ucli.IntFlag{Name: "priority", Usage: "with --tracker: queue priority (higher first)"},
		&ucli.DurationFlag{Name: "wait", Value: 5 * time.Minute, Usage: "with --tracker: longest to wait in the queue for a busy device; given, the request also waits for a device to register when none matches --key and --selector (not given, that fails at once)"},
		&ucli.DurationFlag{Name: "session-timeout", Value: 10 * time.Minute, Usage: "with --tracker: longest the remote session may last"},
		&ucli.DurationFlag{Name: "timeout", Usage: "with --tracker: longest the call (run) or the timing (bench) may take; past it the daemon kills the kernel's worker and frees the device (0: no limit)"},
	}, connFlags()...)
}

// openRunner loads the artifact here, or leases a device and loads it there.
func openRunner(c *ucli.Context, path string, a *artifact.Artifact, fi abi.FuncInfo) (runner, error) {
	dev, err := runDevice(c, a)
	if err != nil {
		return nil, err
	}
	if c.String("tracker") == "" {
		if c.String("key") != "" || c.String("selector") != "" {
			return nil, fmt.Errorf("--key and --selector need --tracker")
		}
		if isCUDAArtifact(a) {
			return openCUDA(a, fi, c.String("memory-cfg"), dev)
		}
		return openLocal(a, fi, c.String("memory-cfg"))
	}
	return openRemote(c, path, a, fi, dev)
}

type localRunner struct {
	mod *load.Module
	f   *packedfunc.Func
}

func openLocal(a *artifact.Artifact, fi abi.FuncInfo, memoryCfg string) (*localRunner, error) {
	mod, err := load.Artifact(a, load.Options{MemoryCfg: memoryCfg})
	if err != nil {
		return nil, err
	}
	f, err := mod.GetFunction(fi.Name)
	if err != nil {
		mod.Close()
		return nil, err
	}
	return &localRunner{mod: mod, f: f}, nil
}

func (r *localRunner) call(_ context.Context, call *preparedCall) error {
	res, err := r.f.Call(call.args...)
	if err != nil {
		return err
	}
	if !call.vm {
		if call.fn.Ret != "" {
			call.returned = res.String()
		}
		return nil
	}
	outs, err := resultArrays(call, res)
	if err != nil {
		return err
	}
	call.setOutputs(outs)
	return nil
}

// resultArrays lists the tensors of a graph function's result, a tensor
// or a tuple of them (nested tuples flattened in order).
func resultArrays(call *preparedCall, res packedfunc.Value) ([]*ndarray.NDArray, error) {
	var outs []*ndarray.NDArray
	var flatten func(v packedfunc.Value) error
	flatten = func(v packedfunc.Value) error {
		if fields, err := v.AsTuple(); err == nil {
			for _, f := range fields {
				if err := flatten(f); err != nil {
					return err
				}
			}
			return nil
		}
		a, err := v.AsArray()
		if err != nil {
			return fmt.Errorf("%s returned a %s, not a tensor", call.fn.Name, v.Kind())
		}
		outs = append(outs, a)
		return nil
	}
	if err := flatten(res); err != nil {
		return nil, err
	}
	return outs, nil
}

func (r *localRunner) time(ctx context.Context, call *preparedCall, o proto.TimeOptions) (proto.TimeResult, error) {
	ev := timer.Evaluator{Call: func() error {
		_, err := r.f.Call(call.args...)
		return err
	}}
	res, err := ev.Evaluate(ctx, timer.OptionsOf(o))
	if err != nil {
		return proto.TimeResult{}, err
	}
	return res.Wire(devices.CPUDevice.String()), nil
}

func (r *localRunner) profile(_ context.Context, call *preparedCall, rounds int) (*load.Profile, error) {
	return r.mod.Profile(call.fn.Name, rounds, call.args...)
}

func (r *localRunner) where() string { return "this machine (" + devices.CPUDevice.String() + ")" }

func (r *localRunner) close() { r.mod.Close() }

type remoteRunner struct {
	tr    *client.Tracker
	lease *client.Lease
	s     *client.Session
	mod   *client.Module
	f     *client.Func
	// dev is where the tensors live on the device daemon: cpu:0, or
	// cuda:0 for an artifact built for cuda (the daemon copies them
	// between host and GPU).
	dev devices.Device
	// remote holds the remote array of each tensor parameter, made by the
	// first call or time and reused.
	remote map[string]*client.Array
}

// knownKey fails at once, naming the keys the tracker knows, when no device
// is registered under key: without --wait a mistyped key should not wait
// in a queue nobody serves.
func knownKey(sum proto.TrackerSummary, key string) error {
	var known []string
	for _, k := range sum.Keys {
		if k.Key == key && k.Free+k.Busy+k.Quarantined+k.Lost > 0 {
			return nil
		}
		if k.Free+k.Busy+k.Quarantined+k.Lost > 0 {
			known = append(known, fmt.Sprintf("%q", k.Key))
		}
	}
	have := "no device is registered at all"
	if len(known) > 0 {
		have = "registered keys: " + strings.Join(known, ", ")
	}
	return fmt.Errorf("no device is registered under key %q (%s); pass --wait DURATION to wait for one: %w", key, have, proto.ErrNotFound)
}

func openRemote(c *ucli.Context, path string, a *artifact.Artifact, fi abi.FuncInfo, dev devices.Device) (_ *remoteRunner, err error) {
	ctx := c.Context
	if c.String("key") == "" && c.String("selector") == "" {
		return nil, fmt.Errorf("--tracker needs --key or --selector to say which device")
	}
	tok, tlsCfg, err := clientAuth(c)
	if err != nil {
		return nil, err
	}
	r := &remoteRunner{remote: map[string]*client.Array{}, dev: dev}
	defer func() {
		if err != nil {
			r.close()
		}
	}()
	r.tr, err = client.DialTracker(ctx, c.String("tracker"), client.TrackerOptions{Token: tok, TLS: tlsCfg})
	if err != nil {
		return nil, err
	}
	sel, onCUDA := c.String("selector"), dev.Type == devices.CUDA
	var need string // the compute capability a cuda artifact needs
	if onCUDA {
		// Only a daemon with a CUDA device new enough runs it: the lease
		// asks for one.
		if need, err = cudaCompute(a); err != nil {
			return nil, err
		}
		if sel != "" {
			sel += ","
		}
		sel += cudaSelector(need)
	}
	if key, wait := c.String("key"), c.IsSet("wait"); (key != "" && !wait) || onCUDA {
		sum, err := r.tr.Query(ctx, 0)
		if err != nil {
			return nil, err
		}
		if key != "" && !wait {
			if err := knownKey(sum, key); err != nil {
				return nil, err
			}
		}
		if onCUDA {
			if err := cudaKey(sum, key, a.Manifest.Target, need, wait); err != nil {
				return nil, err
			}
		}
	}
	w := c.App.ErrWriter
	wctx, cancel := context.WithTimeout(ctx, c.Duration("wait"))
	defer cancel()
	r.lease, err = r.tr.RequestLease(wctx, client.LeaseRequest{
		Key: c.String("key"), Selector: sel, Priority: c.Int("priority"),
		SessionTimeout: c.Duration("session-timeout"), User: "kiln " + c.Command.Name,
		OnPosition: func(pos int, queue string) {
			fmt.Fprintf(w, "waiting for a device: position %d in queue %q\n", pos, queue)
		},
		// Without --wait, a request no registered device could serve
		// fails now rather than waiting in a queue nobody serves.
		Arch: cpu.ArtifactArch(a), FailUnserved: !c.IsSet("wait"),
	})
	if err != nil {
		if errors.Is(err, proto.ErrNotFound) && !c.IsSet("wait") {
			return nil, fmt.Errorf("%w (pass --wait DURATION to wait for one to register)", err)
		}
		return nil, err
	}
	r.s, err = client.Connect(ctx, r.lease.Addr, client.SessionOptions{TLS: tlsCfg, LeaseToken: r.lease.Token})
	if err != nil {
		return nil, err
	}
	data, err := a.Bytes()
	if err != nil {
		return nil, err
	}
	name := filepath.Base(path)
	if err := r.s.Upload(ctx, name, data); err != nil {
		return nil, r.lost(err)
	}
	r.mod, err = r.s.LoadModule(ctx, name, c.String("memory-cfg"))
	if err != nil {
		return nil, r.lost(err)
	}
	r.f, err = r.mod.GetFunction(ctx, fi.Name)
	if err != nil {
		return nil, r.lost(err)
	}
	return r, nil
}

// args copies the tensor arguments to the device (each call, so outputs
// start from the same values) and returns the remote argument list.
func (r *remoteRunner) args(ctx context.Context, call *preparedCall) ([]any, error) {
	var out []any
	i := 0
	for _, p := range call.fn.Params {
		v := call.args[i]
		i++
		switch p.Kind {
		case abi.ParamTensor:
			host := call.arrays[p.Name]
			ra, ok := r.remote[p.Name]
			if !ok {
				var err error
				ra, err = r.s.Empty(ctx, host.Shape(), host.DType(), r.dev)
				if err != nil {
					return nil, fmt.Errorf("allocate %s on the device: %w", p.Name, err)
				}
				r.remote[p.Name] = ra
			}
			if err := r.s.CopyFrom(ctx, ra, host); err != nil {
				return nil, fmt.Errorf("copy %s to the device: %w", p.Name, err)
			}
			out = append(out, ra)
		case abi.ParamInt:
			n, _ := v.AsInt()
			out = append(out, n)
		case abi.ParamFloat:
			x, _ := v.AsFloat()
			out = append(out, x)
		default:
			out = append(out, nil)
		}
	}
	return out, nil
}

// lost names the device when its connection broke in the middle of the
// session (its daemon died, the board rebooted or left the network): the
// error then says so, not only the transport's "unexpected EOF".
func (r *remoteRunner) lost(err error) error {
	if err == nil {
		return nil
	}
	broke := false
	if errors.Is(err, proto.ErrUnavailable) && r.s != nil {
		// A transfer's stream may see the end before the session's
		// connection does: give the connection a moment to say.
		select {
		case <-r.s.Done():
			broke = true
		case <-time.After(3 * time.Second):
		}
	}
	for _, e := range []error{io.EOF, io.ErrUnexpectedEOF, syscall.ECONNRESET, syscall.EPIPE, net.ErrClosed} {
		broke = broke || errors.Is(err, e)
	}
	if broke {
		return fmt.Errorf("the device at %s stopped answering in the middle of the session (its daemon died or the connection broke): %w", r.where(), err)
	}
	return err
}

func (r *remoteRunner) call(ctx context.Context, call *preparedCall) error {
	return r.lost(r.callOn(ctx, call))
}

func (r *remoteRunner) callOn(ctx context.Context, call *preparedCall) error {
	args, err := r.args(ctx, call)
	if err != nil {
		return err
	}
	res, err := r.f.Call(ctx, args...)
	if err != nil {
		return err
	}
	if call.vm {
		var outs []*ndarray.NDArray
		var flatten func(v any) error
		flatten = func(v any) error {
			switch x := v.(type) {
			case []any:
				for _, f := range x {
					if err := flatten(f); err != nil {
						return err
					}
				}
				return nil
			case *client.Array:
				nd, err := r.s.CopyTo(ctx, x)
				if err != nil {
					return fmt.Errorf("copy output %d from the device: %w", len(outs), err)
				}
				outs = append(outs, nd)
				return nil
			}
			return fmt.Errorf("%s returned %T, not a tensor", call.fn.Name, v)
		}
		if err := flatten(res); err != nil {
			return err
		}
		call.setOutputs(outs)
		return nil
	}
	if call.fn.Ret != "" {
		call.returned = fmt.Sprint(res)
	}
	for _, name := range call.outputs {
		nd, err := r.s.CopyTo(ctx, r.remote[name])
		if err != nil {
			return fmt.Errorf("copy %s from the device: %w", name, err)
		}
		call.arrays[name] = nd
	}
	return nil
}

func (r *remoteRunner) time(ctx context.Context, call *preparedCall, o proto.TimeOptions) (proto.TimeResult, error) {
	args, err := r.args(ctx, call)
	if err != nil {
		return proto.TimeResult{}, r.lost(err)
	}
	res, err := r.s.TimeEvaluator(ctx, r.f, o, args...)
	return res, r.lost(err)
}

// profile calls the loaded module's profile function on the device: the
// figures are measured there and come back as JSON.
func (r *remoteRunner) profile(ctx context.Context, call *preparedCall, rounds int) (*load.Profile, error) {
	args, err := r.args(ctx, call)
	if err != nil {
		return nil, r.lost(err)
	}
	f, err := r.mod.GetFunction(ctx, load.ProfileFunc)
	if err != nil {
		return nil, r.lost(err)
	}
	defer f.Free(context.WithoutCancel(ctx))
	res, err := f.Call(ctx, append([]any{call.fn.Name, int64(rounds)}, args...)...)
	if err != nil {
		return nil, r.lost(err)
	}
	text, ok := res.(string)
	if !ok {
		return nil, fmt.Errorf("the device's %s returned %T, not a profile", load.ProfileFunc, res)
	}
	var p load.Profile
	if err := json.Unmarshal([]byte(text), &p); err != nil {
		return nil, fmt.Errorf("the device's profile: %w", err)
	}
	return &p, nil
}

func (r *remoteRunner) where() string {
	return fmt.Sprintf("%s (key %s, node %s)", r.lease.Addr, r.lease.Key, r.lease.NodeID)
}

func (r *remoteRunner) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if r.s != nil {
		r.s.Close()
	}
	if r.lease != nil {
		r.lease.Release(ctx)
	}
	if r.tr != nil {
		r.tr.Close()
	}
}

// stepContext bounds one remote call or timing by --timeout.
func stepContext(c *ucli.Context) (context.Context, context.CancelFunc) {
	if d := c.Duration("timeout"); d > 0 {
		return context.WithTimeout(c.Context, d)
	}
	return context.WithCancel(c.Context)
}
