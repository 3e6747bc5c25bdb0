package rpcserver

import (
	"fmt"
	"sync"

	"github.com/kiln-ml/kiln/ndarray"
	"github.com/kiln-ml/kiln/packedfunc"
	"github.com/kiln-ml/kiln/rpcserver/proto"
)

// object is what a handle names in a worker.
type object struct {
	kind  string // proto.KindModule, KindFunc, KindArray
	name  string // a function's name, a module's file
	mod   packedfunc.Module
	fn    *packedfunc.Func
	arr   *ndarray.NDArray
	owned bool // the worker allocated arr (array.empty) and releases it

	refs  int  // calls in flight that use it
	freed bool // freed by the client; released when refs reaches 0
}

// handles is a worker's table of remote objects. Objects in use by a call
// are not released until it returns, so a free racing a kernel call cannot
// pull memory from under it.
type handles struct {
	mu   sync.Mutex
	next uint64
	objs map[uint64]*object
}

func newHandles() *handles { return &handles{objs: map[uint64]*object{}} }

// add registers an object and returns its handle.
func (h *handles) add(o *object) uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.next++
	h.objs[h.next] = o
	return h.next
}

// acquire returns the object of handle, of kind, and holds it until
// release is called.
func (h *handles) acquire(handle uint64, kind string) (*object, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	o := h.objs[handle]
	if o == nil || o.freed {
		return nil, fmt.Errorf("no %s with handle %d in this session: %w", kind, handle, proto.ErrNotFound)
	}
	if o.kind != kind {
		return nil, fmt.Errorf("handle %d is a %s, not a %s: %w", handle, o.kind, kind, proto.ErrBadRequest)
	}
	o.refs++
	return o, nil
}

// release ends one use of o, releasing it if it was freed meanwhile.
func (h *handles) release(o *object) {
	h.mu.Lock()
	o.refs--
	done := o.freed && o.refs == 0
	h.mu.Unlock()
	if done {
		o.destroy()
	}
}

// free drops handle; the object is released once no call uses it.
func (h *handles) free(handle uint64) error {
	h.mu.Lock()
	o := h.objs[handle]
	if o == nil {
		h.mu.Unlock()
		return fmt.Errorf("free: no object with handle %d in this session: %w", handle, proto.ErrNotFound)
	}
	delete(h.objs, handle)
	o.freed = true
	done := o.refs == 0
	h.mu.Unlock()
	if done {
		o.destroy()
	}
	return nil
}

// closeAll releases every object (the session is ending).
func (h *handles) closeAll() {
	h.mu.Lock()
	objs := h.objs
	h.objs = map[uint64]*object{}
	h.mu.Unlock()
	for _, o := range objs {
		h.mu.Lock()
		o.freed = true
		done := o.refs == 0
		h.mu.Unlock()
		if done {
			o.destroy()
		}
	}
}

// destroy releases what o holds.
func (o *object) destroy() {
	switch {
	case o.arr != nil && o.owned:
		o.arr.Release()
	case o.mod != nil:
		o.mod.Close()
	}
}
