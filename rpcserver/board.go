package rpcserver

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/kiln-ml/kiln/rpcserver/proto"
)

// A call board is a page of memory the daemon and a session's worker share
// (a memfd the worker maps as descriptor EnvWorkerBoardFD). The worker
// writes on it, with plain stores and atomics and no system call, what
// each request it serves is doing; the daemon reads it when the worker has
// died (which calls were running, which ran past its deadline) and when
// /metrics is scraped (calls in flight, calls served on the session's call
// connection). That is how the daemon, off the per-call path since the
// client's call connection goes straight to the worker, can still say
// which function crashed.
//
// The daemon writes on it too, at peersAt, how many other sessions it
// serves, for the time evaluator's validity report.
//
// Layout: counters of the calls served on the call connection, one
// uint64 per (method, code) pair, the uint32 of other sessions at peersAt,
// then boardSlots slots of slotSize bytes:
// a uint32 state, a uint32 meta (method index, a flag for the call
// connection, the text's length) and the text that describes the request.
const (
	boardSize    = 64 << 10
	boardMethods = 16
	boardCodes   = 16
	slotsAt      = 4096
	slotSize     = 128
	slotText     = slotSize - 8
	boardSlots   = (boardSize - slotsAt) / slotSize
	peersAt      = boardMethods * boardCodes * 8
)

// Slot states.
const (
	slotFree     = 0
	slotClaimed  = 1 // being written
	slotRunning  = 2
	slotOverran  = 3 // ran past its deadline: the worker kills itself
	metaDirect   = 1 << 8
	metaLenShift = 16
)

// boardMethodNames are the methods a board counts, by index; methods not
// named share the last index.
var boardMethodNames = append(slices.Clone(forwarded), proto.WorkerBulkSize, "other")

// boardCodeNames are the result codes a board counts, by index ("ok" first).
var boardCodeNames = []proto.Code{"ok", proto.CodeUnauthorized, proto.CodeVersion, proto.CodeNotFound,
	proto.CodeBadRequest, proto.CodeDeadline, proto.CodeSessionExpired, proto.CodeCrashed, proto.CodeBusy,
	proto.CodeUnavailable, proto.CodeInternal, proto.CodeCancelled, proto.CodeQuota, proto.CodeTooLarge}

func boardMethod(method string) int {
	if i := slices.Index(boardMethodNames, method); i >= 0 {
		return i
	}
	return len(boardMethodNames) - 1
}

func boardCode(err error) int {
	if err == nil {
		return 0
	}
	if i := slices.Index(boardCodeNames, proto.ToWire(err).Code); i >= 0 {
		return i
	}
	return slices.Index(boardCodeNames, proto.CodeInternal)
}

// board is a mapped call board; a nil *board does nothing.
type board struct {
	mem  []byte
	next atomic.Uint32 // where the worker looks for a free slot first

	// The daemon reads (calls, counts) under mu's read lock and unmaps
	// under its write lock: a scrape must not read a page unmapped
	// under it.
	mu   sync.RWMutex
	gone bool
}

func (b *board) state(i int) *atomic.Uint32 {
	return (*atomic.Uint32)(unsafe.Pointer(&b.mem[slotsAt+i*slotSize]))
}

func (b *board) meta(i int) *atomic.Uint32 {
	return (*atomic.Uint32)(unsafe.Pointer(&b.mem[slotsAt+i*slotSize+4]))
}

func (b *board) counter(method, code int) *atomic.Uint64 {
	return (*atomic.Uint64)(unsafe.Pointer(&b.mem[(method*boardCodes+code)*8]))
}

// claim takes a free slot for a request of method and labels it with the
// method's name; it returns -1 when every slot is taken (the request is
// then not on the board).
func (b *board) claim(method int, direct bool) int {
	if b == nil {
		return -1
	}
	start := int(b.next.Load())
	for k := range boardSlots {
		i := (start + k) % boardSlots
		if b.state(i).CompareAndSwap(slotFree, slotClaimed) {
			b.next.Store(uint32((i + 1) % boardSlots))
			m := uint32(method)
			if direct {
				m |= metaDirect
			}
			b.meta(i).Store(m)
			b.label(i, boardMethodNames[method])
			b.state(i).Store(slotRunning)
			return i
		}
	}
	return -1
}

// label sets the text of slot i: parts joined, cut at slotText bytes.
func (b *board) label(i int, parts ...string) {
	if b == nil || i < 0 {
		return
	}
	text := b.mem[slotsAt+i*slotSize+8 : slotsAt+(i+1)*slotSize]
	n := 0
	for _, p := range parts {
		n += copy(text[n:], p)
	}
	m := b.meta(i).Load()
	b.meta(i).Store(m&(1<<metaLenShift-1) | uint32(n)<<metaLenShift)
}

// release frees slot i, counting the result of a call-connection request.
func (b *board) release(i int, err error) {
	if b == nil || i < 0 {
		return
	}
	m := b.meta(i).Load()
	if m&metaDirect != 0 {
		b.counter(int(m&0xff), boardCode(err)).Add(1)
	}
	b.state(i).CompareAndSwap(slotRunning, slotFree)
}

// setPeers posts, from the daemon, how many other sessions it serves.
func (b *board) setPeers(n int) {
	if b == nil {
		return
	}
	b.mu.RLock()
	defer b.mu.RUnlock()
	if !b.gone {
		b.peerCount().Store(uint32(max(n, 0)))
	}
}

// peers returns, in the worker, how many other sessions the daemon serves
// (0 without a board).
func (b *board) peers() int {
	if b == nil {
		return 0
	}
	return int(b.peerCount().Load())
}

func (b *board) peerCount() *atomic.Uint32 {
	return (*atomic.Uint32)(unsafe.Pointer(&b.mem[peersAt]))
}

// overran marks slot i as past its deadline; false when it had finished.
func (b *board) overran(i int) bool {
	return b != nil && i >= 0 && b.state(i).CompareAndSwap(slotRunning, slotOverran)
}

// boardCall is a request on the board as the daemon reads it.
type boardCall struct {
	method  string
	text    string
	direct  bool
	overran bool
}

// calls returns the requests on the board now.
func (b *board) calls() []boardCall {
	if b == nil {
		return nil
	}
	b.mu.RLock()
	defer b.mu.RUnlock()
	if b.gone {
		return nil
	}
	var out []boardCall
	for i := range boardSlots {
		st := b.state(i).Load()
		if st != slotRunning && st != slotOverran {
			continue
		}
		m := b.meta(i).Load()
		n := min(int(m>>metaLenShift), slotText)
		text := string(b.mem[slotsAt+i*slotSize+8 : slotsAt+i*slotSize+8+n])
		method := boardMethodNames[min(int(m&0xff), len(boardMethodNames)-1)]
		out = append(out, boardCall{method: method, text: text, direct: m&metaDirect != 0, overran: st == slotOverran})
	}
	return out
}

// counts returns the call connection's counters, by method and code.
func (b *board) counts() [boardMethods][boardCodes]uint64 {
	var out [boardMethods][boardCodes]uint64
	if b == nil {
		return out
	}
	b.mu.RLock()
	defer b.mu.RUnlock()
	if b.gone {
		return out
	}
	for m := range len(boardMethodNames) {
		for c := range len(boardCodeNames) {
			out[m][c] = b.counter(m, c).Load()
		}
	}
	return out
}

// slotKey is the context key of a request's board slot in the worker.
type slotKey struct{}

// slotOf returns the board slot of the request ctx belongs to, or -1.
func slotOf(ctx context.Context) int {
	if i, ok := ctx.Value(slotKey{}).(int); ok {
		return i
	}
	return -1
}
