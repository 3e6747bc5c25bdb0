package interp

import (
	"errors"
	"fmt"
	"strings"

	"github.com/kiln-ml/kiln/compiler/ir"
)

// ErrDataRace reports an access to shared memory that CUDA does not order:
// a thread of a block reads or overwrites what another thread of the same
// block wrote with no barrier between (within one threadIdx loop nest:
// sibling nests are separated by the barrier that barrier insertion
// places), or reads shared memory that no thread of its block has
// written. (The threads of a block run one after
// another, so a read of what another thread writes later shows as a read
// of unwritten memory.)
var ErrDataRace = errors.New("data race on shared memory")

// access is what the threads of the current block did to one element of
// shared memory.
type access struct {
	written bool
	writer  [3]int64
	phase   int // the gpu.phase of the last write
}

// gpu is the state of a run inside thread-bound loops.
type gpu struct {
	threadDepth int      // threadIdx loops entered
	blockDepth  int      // blockIdx loops entered
	thread      [3]int64 // threadIdx.x, y, z of the running thread
	// phase counts the outermost threadIdx loops finished: the barrier
	// between two sibling thread loops (the one barrier insertion places)
	// makes earlier writes visible to every thread.
	phase int
	log   map[*memory]map[int]*access
	// lane is set in the threads of a loop run in lockstep (warp.go).
	lane *warpLane
}

// threadAxis returns the dimension (0-2) of a threadIdx or blockIdx tag,
// and whether it is a thread (not a block) axis.
func threadAxis(tag string) (dim int, thread, ok bool) {
	for prefix, th := range map[string]bool{"threadIdx.": true, "blockIdx.": false} {
		if rest, found := strings.CutPrefix(tag, prefix); found && len(rest) == 1 && rest[0] >= 'x' && rest[0] <= 'z' {
			return int(rest[0] - 'x'), th, true
		}
	}
	return 0, false, false
}

// boundLoop runs a loop bound to a thread axis with CUDA's semantics: the
// threads of a block run one after another (so the order of a race is
// visible either way round), and each iteration of a blockIdx loop starts
// a new block, whose shared memory holds nothing any of its threads wrote.
func (m *machine) boundLoop(tag string, v *ir.Var, min, extent ir.Expr, body ir.Stmt) error {
	dim, thread, ok := threadAxis(tag)
	if !ok {
		return m.loop(v, min, extent, body)
	}
	if !thread {
		m.gpu.blockDepth++
		defer func() { m.gpu.blockDepth-- }()
		return m.loopEach(v, min, extent, body, func(int64) { m.gpu.log = nil })
	}
	if dim == 0 && m.gpu.lane == nil && hasShuffle(body) {
		return m.lockstep(v, min, extent, body)
	}
	outer := m.gpu.thread[dim]
	m.gpu.threadDepth++
	defer func() {
		m.gpu.threadDepth--
		m.gpu.thread[dim] = outer
		if m.gpu.threadDepth == 0 {
			m.gpu.phase++
		}
	}()
	return m.loopEach(v, min, extent, body, func(i int64) { m.gpu.thread[dim] = i })
}

// shared checks an access to shared memory mem at byte offset off by the
// running thread.
func (m *machine) shared(mem *memory, off int, b *ir.Buffer, indices []int64, write bool) error {
	if m.gpu.threadDepth == 0 {
		return nil
	}
	if m.gpu.log == nil {
		m.gpu.log = map[*memory]map[int]*access{}
	}
	elems := m.gpu.log[mem]
	if elems == nil {
		elems = map[int]*access{}
		m.gpu.log[mem] = elems
	}
	me := m.gpu.thread
	a := elems[off]
	if a == nil {
		a = &access{}
		elems[off] = a
	}
	where := fmt.Sprintf("shared %q%s", b.Name, fmtIndex(indices))
	if write {
		if a.written && a.phase == m.gpu.phase && a.writer != me {
			return fmt.Errorf("%s: thread %s overwrites what thread %s wrote, with no barrier between: %w", where, fmtThread(me), fmtThread(a.writer), ErrDataRace)
		}
		a.written, a.writer, a.phase = true, me, m.gpu.phase
		return nil
	}
	switch {
	case !a.written:
		return fmt.Errorf("%s: thread %s reads what no thread of its block wrote: %w", where, fmtThread(me), ErrDataRace)
	case a.phase == m.gpu.phase && a.writer != me:
		return fmt.Errorf("%s: thread %s reads what thread %s wrote, with no barrier between: %w", where, fmtThread(me), fmtThread(a.writer), ErrDataRace)
	}
	return nil
}

func fmtThread(t [3]int64) string { return fmt.Sprintf("(%d, %d, %d)", t[0], t[1], t[2]) }

// perThread reports whether memory for a buffer of scope allocated now is
// private to each thread: a "local" buffer allocated in a kernel is, as
// in CUDA, where every thread runs the allocation (a register accumulator
// that lives from one thread loop nest to the next, or one allocated in a
// warp's threadIdx.y loop and used in its threadIdx.x loops).
func (m *machine) perThread(scope string) bool {
	return scope == "local" && m.gpu.blockDepth > 0
}

// threadCopy returns the running thread's copy of per-thread memory mem,
// created on first use (filled as Allocate fills memory), or mem itself
// outside the threadIdx loops.
func (m *machine) threadCopy(mem *memory) *memory {
	if m.gpu.threadDepth == 0 {
		return mem
	}
	c := mem.threads[m.gpu.thread]
	if c == nil {
		c = &memory{name: mem.name, data: make([]byte, len(mem.data))}
		copy(c.data, mem.data)
		mem.threads[m.gpu.thread] = c
	}
	return c
}
