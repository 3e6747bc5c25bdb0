package main

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"time"
)

// contentionResult is a model's latency in one condition of --contention:
// kiln's median and mean (the mean carries the stalls a median hides), ONNX
// Runtime's median where it runs.
type contentionResult struct {
	// Condition is quiet, busy1 or busy2 (beside that many CPU-bound
	// processes), or sessions2 (in a daemon's session while a second session
	// on the same daemon runs the same model).
	Condition  string  `json:"condition"`
	KilnMS     float64 `json:"kiln_ms"`
	KilnMeanMS float64 `json:"kiln_mean_ms"`
	ORTMS      float64 `json:"ort_ms,omitempty"`
	VsORT      float64 `json:"kiln_vs_ort,omitempty"`
	// VsQuiet is kiln's median here over its median in the quiet condition
	// (for sessions2: over SoloMS).
	VsQuiet float64 `json:"kiln_vs_quiet"`
	// SoloMS (sessions2 only) is the same daemon session's median while
	// the other session is idle.
	SoloMS float64 `json:"solo_ms,omitempty"`
}

// measureContention times a model quiet, then beside one and two CPU-bound
// processes (busy loops of a shell, pinned to nothing), kiln and then ONNX
// Runtime (timeORT nil: none) in each, rounds inferences each.
func measureContention(ctx context.Context, rounds int, timeKiln func(int) ([]float64, error), timeORT func() (float64, error)) ([]contentionResult, error) {
	var out []contentionResult
	for busy := 0; busy <= 2; busy++ {
		stop, err := startBusy(ctx, busy)
		if err != nil {
			return nil, err
		}
		c := contentionResult{Condition: "quiet"}
		if busy > 0 {
			c.Condition = fmt.Sprintf("busy%d", busy)
		}
		ts, err := timeKiln(rounds)
		if err == nil {
			c.KilnMS = median(ts)
			for _, t := range ts {
				c.KilnMeanMS += t / float64(len(ts))
			}
			if timeORT != nil {
				if c.ORTMS, err = timeORT(); err == nil && c.ORTMS > 0 {
					c.VsORT = c.KilnMS / c.ORTMS
				}
			}
		}
		stop()
		if err != nil {
			return nil, fmt.Errorf("contention %s: %w", c.Condition, err)
		}
		if len(out) > 0 && out[0].KilnMS > 0 {
			c.VsQuiet = c.KilnMS / out[0].KilnMS
		} else {
			c.VsQuiet = 1
		}
		out = append(out, c)
	}
	return out, nil
}

// startBusy starts n CPU-bound processes and returns what stops them.
func startBusy(ctx context.Context, n int) (stop func(), err error) {
	var cmds []*exec.Cmd
	stop = func() {
		for _, c := range cmds {
			c.Process.Kill()
			c.Wait()
		}
	}
	for range n {
		c := exec.CommandContext(ctx, "sh", "-c", "while :; do :; done")
		if err := c.Start(); err != nil {
			stop()
			return nil, fmt.Errorf("start a busy process: %w", err)
		}
		cmds = append(cmds, c)
	}
	if n > 0 {
		time.Sleep(200 * time.Millisecond) // let the scheduler spread them
	}
	return stop, nil
}

// contentionLine renders --contention's figures for Line.
func contentionLine(cs []contentionResult) string {
	if len(cs) == 0 {
		return ""
	}
	var parts []string
	for _, c := range cs {
		s := fmt.Sprintf("%s %.3g ms (mean %.3g", c.Condition, c.KilnMS, c.KilnMeanMS)
		if c.SoloMS > 0 {
			s += fmt.Sprintf(", the session alone %.3g, ×%.2f", c.SoloMS, c.VsQuiet)
		}
		if c.ORTMS > 0 {
			s += fmt.Sprintf(", ORT %.3g, ×%.2f", c.ORTMS, c.VsORT)
		}
		parts = append(parts, s+")")
	}
	return "; contention: " + strings.Join(parts, ", ")
}
