package main

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"time"

	"github.com/kiln-ml/kiln/client"
	"github.com/kiln-ml/kiln/devices"
	"github.com/kiln-ml/kiln/devices/cpu"
	"github.com/kiln-ml/kiln/ndarray"
	"github.com/kiln-ml/kiln/rpcserver"
)

// remoteSpec is what a model needs to run in a device daemon's session:
// its artifact and the arguments of its entry (the input, then the weights).
type remoteSpec struct {
	artifact []byte
	args     []*ndarray.NDArray
}

// remoteModel is a model loaded in one session of a device daemon.
type remoteModel struct {
	s    *client.Session
	f    *client.Func
	args []any
}

// openRemoteModel opens a session on addr, uploads the artifact and the
// entry's arguments and loads the module.
func openRemoteModel(ctx context.Context, addr string, spec *remoteSpec) (*remoteModel, error) {
	s, err := client.Connect(ctx, addr, client.SessionOptions{})
	if err != nil {
		return nil, err
	}
	r := &remoteModel{s: s}
	if err := r.load(ctx, spec); err != nil {
		s.Close()
		return nil, err
	}
	return r, nil
}

func (r *remoteModel) load(ctx context.Context, spec *remoteSpec) error {
	if err := r.s.Upload(ctx, "model.kiln", spec.artifact); err != nil {
		return err
	}
	m, err := r.s.LoadModule(ctx, "model.kiln")
	if err != nil {
		return err
	}
	if r.f, err = m.GetFunction(ctx, "main"); err != nil {
		return err
	}
	for _, x := range spec.args {
		a, err := r.s.Empty(ctx, x.Shape(), x.DType(), devices.CPUDevice)
		if err != nil {
			return err
		}
		if err := r.s.CopyFrom(ctx, a, x); err != nil {
			return err
		}
		r.args = append(r.args, a)
	}
	return nil
}

// time runs the model rounds times on the device, one call a measurement,
// and returns each call's milliseconds.
func (r *remoteModel) time(ctx context.Context, rounds int) ([]float64, error) {
	res, err := r.s.TimeEvaluator(ctx, r.f, client.TimeOptions{Number: 1, Repeat: rounds}, r.args...)
	if err != nil {
		return nil, err
	}
	ms := make([]float64, len(res.Results))
	for i, s := range res.Results {
		ms[i] = s * 1e3
	}
	return ms, nil
}

// measureSessions is --contention's "sessions2" condition: the model in a
// session of a device daemon on loopback (two pool threads, like the
// peers) while a second session on the same daemon runs the same model
// without pause, against ONNX Runtime beside a second ONNX Runtime process
// running the same model (ortBusy nil: no ONNX Runtime). VsQuiet is over
// the same session's latency with the other session idle.
func measureSessions(ctx context.Context, rounds int, spec *remoteSpec, ortBusy func() (func(), error), timeORT func() (float64, error)) (contentionResult, error) {
	c := contentionResult{Condition: "sessions2"}
	bd, err := startBenchDaemon(ctx, func(cfg *rpcserver.Config) {
		cfg.MaxSessions, cfg.InsecureShared = 2, true
		cfg.Worker.Env = append(cfg.Worker.Env, cpu.EnvThreads+"=2")
	})
	if err != nil {
		return c, err
	}
	defer bd.stop()
	addr := bd.d.Addr().String()
	a, err := openRemoteModel(ctx, addr, spec)
	if err != nil {
		return c, fmt.Errorf("first session: %w", err)
	}
	defer a.s.Close()
	b, err := openRemoteModel(ctx, addr, spec)
	if err != nil {
		return c, fmt.Errorf("second session: %w", err)
	}
	defer b.s.Close()
	if _, err := b.time(ctx, 3); err != nil { // warm-up: first-call repacks
		return c, err
	}
	solo, err := b.time(ctx, rounds)
	if err != nil {
		return c, err
	}
	// The other session runs the model until this one has its figures.
	bctx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var busyErr error
	wg.Go(func() {
		for bctx.Err() == nil {
			if _, err := a.time(bctx, 5); err != nil && bctx.Err() == nil {
				busyErr = err
				return
			}
		}
	})
	time.Sleep(200 * time.Millisecond)
	ts, err := b.time(ctx, rounds)
	stop()
	wg.Wait()
	if err = errors.Join(err, busyErr); err != nil {
		return c, err
	}
	c.KilnMS, c.SoloMS = median(ts), median(solo)
	for _, t := range ts {
		c.KilnMeanMS += t / float64(len(ts))
	}
	c.VsQuiet = c.KilnMS / c.SoloMS
	if ortBusy != nil && timeORT != nil {
		stopORT, err := ortBusy()
		if err != nil {
			return c, err
		}
		c.ORTMS, err = timeORT()
		stopORT()
		if err != nil {
			return c, err
		}
		if c.ORTMS > 0 {
			c.VsORT = c.KilnMS / c.ORTMS
		}
	}
	return c, nil
}

// startORTBusy starts an ONNX Runtime process that runs the model without
// pause (until stopped) and waits until it has made its session.
func startORTBusy(ctx context.Context, ort, model, x string, shape []int64) (func(), error) {
	cmd := ortCommand(ctx, ort, model, x, shape, model+".busy.ort.bin", 1<<30)
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start a second ONNX Runtime: %w", err)
	}
	time.Sleep(2 * time.Second) // node's start and the session's optimisation
	return func() { cmd.Process.Kill(); cmd.Wait() }, nil
}

// ortCommand is the command that times the model in ONNX Runtime.
func ortCommand(ctx context.Context, ort, model, x string, shape []int64, out string, rounds int) *exec.Cmd {
	dims := make([]string, len(shape))
	for i, d := range shape {
		dims[i] = fmt.Sprint(d)
	}
	cmd := exec.CommandContext(ctx, "node", ortScript(ort), model, x, strings.Join(dims, ","), out, fmt.Sprint(rounds))
	cmd.Dir = ort
	return cmd
}

// ortShape is the input shape of a bench onnx model.
func ortShape(name string) []int64 {
	if strings.HasPrefix(name, "transformer") {
		return []int64{1, 32, 128}
	}
	return []int64{1, 3, 224, 224}
}
