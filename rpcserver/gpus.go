package rpcserver

import (
	"os"
	"strconv"
	"strings"

	"github.com/kiln-ml/kiln/devices"
	"github.com/kiln-ml/kiln/devices/cuda"
)

// sessionGPUs lists the GPUs this daemon hands out one per session, each
// as the CUDA_VISIBLE_DEVICES value that shows a worker that GPU alone:
// the entries of the daemon's own CUDA_VISIBLE_DEVICES, else the ordinals.
// It is nil with fewer than two GPUs: a worker then sees what the daemon
// sees.
func sessionGPUs() []string {
	if ok, _ := cuda.Available(); !ok {
		return nil
	}
	api, err := devices.Get(devices.CUDA)
	if err != nil {
		return nil
	}
	n := api.Count()
	if n < 2 {
		return nil
	}
	var gpus []string
	if v, ok := os.LookupEnv("CUDA_VISIBLE_DEVICES"); ok {
		for _, e := range strings.Split(v, ",") {
			gpus = append(gpus, strings.TrimSpace(e))
		}
	}
	if len(gpus) < n {
		gpus = gpus[:0]
		for i := range n {
			gpus = append(gpus, strconv.Itoa(i))
		}
	}
	return gpus[:n]
}

// pickGPU returns the index in d.gpus of the GPU the fewest open sessions
// use (the lowest of those), or -1 when sessions do not get one each.
// d.mu must be held, and s not yet among d.sessions.
func (d *Daemon) pickGPU() int {
	if len(d.gpus) == 0 {
		return -1
	}
	use := make([]int, len(d.gpus))
	for o := range d.sessions {
		if o.gpu >= 0 {
			use[o.gpu]++
		}
	}
	best := 0
	for i, u := range use {
		if u < use[best] {
			best = i
		}
	}
	return best
}
