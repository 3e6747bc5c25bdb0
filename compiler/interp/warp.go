package interp

import (
	"errors"
	"fmt"
	"maps"

	"github.com/kiln-ml/kiln/compiler/ir"
)

// A threadIdx loop whose body shuffles values between the lanes of a warp
// (tvm_warp_shuffle_down) cannot run its threads one after another: a
// shuffle needs the value its source lane computes at the same point. Such
// a loop runs its threads in lockstep from shuffle to shuffle: each thread
// (in order, one at a time) runs until its next shuffle or its end; then
// every shuffle of the round is answered and the threads go on. Between
// shuffles the threads still run one after another, so shared memory is
// checked for races as in any other thread loop.

// shuffleCall is what a thread reports to the scheduler of its loop: the
// value it offers at a shuffle, its fragments at a ptx_mma (mma set), or
// its end.
type shuffleCall struct {
	value        Value
	delta, width int64
	warpSize     int64
	mma          *mmaFragments
	site         *ir.Call
	done         bool
	err          error
}

// laneResult answers a thread at a shuffle (value) or at a ptx_mma (d, its
// fragment of the result).
type laneResult struct {
	value Value
	d     [4]float32
}

// warpLane is a thread's side of the lockstep: it reports on yield and waits
// on resume for the shuffle's result (closed when the loop is abandoned).
type warpLane struct {
	yield  chan shuffleCall
	resume chan laneResult
}

var errAbandoned = errors.New("thread loop abandoned")

// hasShuffle reports whether s calls tvm_warp_shuffle_down or ptx_mma (a
// warp-wide operation).
func hasShuffle(s ir.Stmt) bool {
	found := false
	ir.Visit(s, func(n ir.Node) bool {
		if c, ok := n.(*ir.Call); ok && (c.Op == ir.OpWarpShuffleDown || c.Op == ir.OpPtxMma) {
			found = true
		}
		return !found
	})
	return found
}

// shuffle offers v at a warp shuffle and returns the source lane's value.
func (m *machine) shuffle(e *ir.Call, v Value, delta, width, warpSize int64) (Value, error) {
	if m.gpu.lane == nil {
		return Value{}, fmt.Errorf("evaluate %s: a warp shuffle outside a threadIdx.x loop", e)
	}
	m.gpu.lane.yield <- shuffleCall{value: v, delta: delta, width: width, warpSize: warpSize, site: e}
	r, ok := <-m.gpu.lane.resume
	if !ok {
		return Value{}, errAbandoned
	}
	return r.value, nil
}

// lockstep runs the threads of a threadIdx.x loop whose body shuffles
// (see above). Inside threadIdx.y or z loops, the loop's threads are
// those of one row of the block, which hold whole warps when they are a
// multiple of 32: a warp is 32 consecutive lanes of threadIdx.x, for the
// same threadIdx.y and z.
func (m *machine) lockstep(v *ir.Var, min, extent ir.Expr, body ir.Stmt) error {
	lo, err := m.evalInt(min, "loop min")
	if err != nil {
		return fmt.Errorf("for %q: %w", v.Name, err)
	}
	n, err := m.evalInt(extent, "loop extent")
	if err != nil {
		return fmt.Errorf("for %q: %w", v.Name, err)
	}
	outer := m.gpu.threadDepth
	if outer > 0 && n%32 != 0 {
		return fmt.Errorf("for %q: a warp-wide operation in a threadIdx.x loop of %d threads inside a threadIdx.y or z loop: its warps would span rows of the block", v.Name, n)
	}
	if m.gpu.log == nil {
		m.gpu.log = map[*memory]map[int]*access{}
	}
	m.gpu.threadDepth++
	defer func() {
		m.gpu.threadDepth--
		if outer == 0 {
			m.gpu.phase++
		}
	}()
	threads := make([]*machine, n)
	for i := range threads {
		t := &machine{vars: maps.Clone(m.vars), mem: maps.Clone(m.mem), layouts: maps.Clone(m.layouts), opts: m.opts, steps: m.steps, gpu: m.gpu}
		t.gpu.thread[0] = int64(i)
		t.vars[v] = Int(v.Type, lo+int64(i))
		t.gpu.lane = &warpLane{yield: make(chan shuffleCall, 1), resume: make(chan laneResult)}
		threads[i] = t
		go func() {
			if _, ok := <-t.gpu.lane.resume; !ok {
				t.gpu.lane.yield <- shuffleCall{done: true, err: errAbandoned}
				return
			}
			err := t.exec(body)
			t.gpu.lane.yield <- shuffleCall{done: true, err: err}
		}()
	}
	calls := make([]shuffleCall, n)
	results := make([]laneResult, n)
	finished := make([]bool, n)
	// abandon ends every unfinished thread: blocked before its start or
	// at a shuffle, each reports its end once more.
	abandon := func() {
		for i, t := range threads {
			if !finished[i] {
				close(t.gpu.lane.resume)
				<-t.gpu.lane.yield
				finished[i] = true
			}
		}
	}
	base := m.steps
	defer func() {
		total := base
		for _, t := range threads {
			total += t.steps - base
		}
		m.steps = total
	}()
	for {
		for i, t := range threads {
			if finished[i] {
				continue
			}
			t.gpu.lane.resume <- results[i]
			calls[i] = <-t.gpu.lane.yield
			if calls[i].done {
				finished[i] = true
				if calls[i].err != nil {
					abandon()
					return calls[i].err
				}
			}
		}
		left := 0
		for i := range threads {
			if !finished[i] {
				left++
			}
		}
		if left == 0 {
			return nil
		}
		// Every thread of a warp with a thread at a shuffle must be at the
		// same shuffle.
		for i := range threads {
			if finished[i] {
				continue
			}
			c := calls[i]
			if c.mma != nil {
				if first := int64(i) / 32 * 32; int64(i) != first {
					if finished[first] || calls[first].site != c.site {
						abandon()
						return fmt.Errorf("evaluate %s: thread (%d, 0, 0) runs ptx_mma but thread (%d, 0, 0) of its warp does not reach the same ptx_mma", c.site, i, first)
					}
					continue // answered with the first lane of its warp
				}
				if int64(i)+32 > n {
					abandon()
					return fmt.Errorf("evaluate %s: ptx_mma needs the 32 threads of a warp; threads (%d, 0, 0) to (%d, 0, 0) are %d", c.site, i, n-1, n-int64(i))
				}
				frags := make([]*mmaFragments, 32)
				for l := range frags {
					j := i + l
					if finished[j] || calls[j].site != c.site || calls[j].mma == nil {
						abandon()
						return fmt.Errorf("evaluate %s: thread (%d, 0, 0) runs ptx_mma but thread (%d, 0, 0) of its warp does not reach the same ptx_mma", c.site, i, j)
					}
					frags[l] = calls[j].mma
				}
				for l, d := range warpMma(frags) {
					results[i+l] = laneResult{d: d}
				}
				continue
			}
			ws := c.warpSize
			if ws <= 0 || c.width <= 0 || c.width > ws || ws&(ws-1) != 0 || c.width&(c.width-1) != 0 || c.delta < 0 {
				abandon()
				return fmt.Errorf("evaluate %s: warp size %d, width %d and delta %d are not a valid shuffle", c.site, ws, c.width, c.delta)
			}
			first := int64(i) / ws * ws
			for j := first; j < first+ws && j < n; j++ {
				if finished[j] || calls[j].site != c.site || calls[j].mma != nil || calls[j].delta != c.delta || calls[j].width != c.width {
					abandon()
					return fmt.Errorf("evaluate %s: thread (%d, 0, 0) shuffles but thread (%d, 0, 0) of its warp does not reach the same shuffle", c.site, i, j)
				}
			}
			src := int64(i) + c.delta
			if int64(i)%c.width+c.delta < c.width && src < n {
				results[i] = laneResult{value: calls[src].value}
			} else {
				results[i] = laneResult{value: c.value}
			}
		}
	}
}
