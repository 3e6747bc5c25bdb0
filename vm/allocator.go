package vm

import (
	"fmt"

	"github.com/kiln-ml/kiln/devices"
	"github.com/kiln-ml/kiln/ndarray"
)

// Memory configurations (Options.MemoryCfg).
const (
	// MemoryNaive allocates each storage from the device and frees it when
	// the invocation that made it ends.
	MemoryNaive = "naive"
	// MemoryPooled keeps freed storage blocks and hands them out again to
	// requests of the same size, scope and device (the default).
	MemoryPooled = "pooled"
)

// poolAlign is the granularity pooled block sizes are rounded to.
const poolAlign = 64

// maxCachedViews bounds the tensor views a pooled block remembers. A
// block that memory planning shares among concatenations written in
// place holds three views per concatenation (squeezenet1_1's: 12).
const maxCachedViews = 16

// storage is one block made by vm.builtin.alloc_storage.
type storage struct {
	buf   *ndarray.NDArray // uint8 array of cap bytes
	size  int64            // bytes requested
	cap   int64            // bytes held (size rounded up when pooled)
	dev   devices.Device
	scope string
	// escaped is set when the block is reachable from an invocation's
	// result: the caller owns it from then on (the garbage collector frees
	// it with the last array that views it) unless it gives it back with
	// VM.Recycle.
	escaped bool
	// pinned is set on storage held by a call_cached result: Recycle
	// never gives it back.
	pinned bool
	owner  allocator
	views  []cachedView
}

type cachedView struct {
	offset int64
	dtype  ndarray.DType
	arr    *ndarray.NDArray
}

func (s *storage) String() string {
	return fmt.Sprintf("storage(%d bytes, %s, scope %q)", s.size, s.dev, s.scope)
}

// view returns a tensor of shape and dtype at offset inside the block.
func (s *storage) view(offset int64, shape ndarray.Shape, dtype ndarray.DType, cache bool) (*ndarray.NDArray, error) {
	if offset < 0 {
		return nil, fmt.Errorf("alloc_tensor: negative offset %d", offset)
	}
	if err := shape.Validate(); err != nil {
		return nil, fmt.Errorf("alloc_tensor: %w", err)
	}
	if !validDType(dtype) {
		return nil, fmt.Errorf("alloc_tensor: bad dtype %s", dtype)
	}
	n, sz := shape.NumElements(), int64(dtype.Size())
	if sz > 0 && n > (1<<62)/sz {
		return nil, fmt.Errorf("alloc_tensor: shape %s of %s is too large", shape, dtype)
	}
	need := n * sz
	if offset > s.size || need > s.size-offset {
		return nil, fmt.Errorf("alloc_tensor: offset %d + %d bytes runs past storage of %d bytes", offset, need, s.size)
	}
	if cache {
		for _, v := range s.views {
			if v.offset == offset && v.dtype == dtype && v.arr.Shape().Equal(shape) {
				return v.arr, nil
			}
		}
	}
	base := s.buf
	if offset != 0 {
		var err error
		base, err = s.buf.StridedView(ndarray.Shape{s.cap - offset}, ndarray.Uint8, []int64{1}, offset)
		if err != nil {
			return nil, fmt.Errorf("alloc_tensor: %w", err)
		}
	}
	arr, err := base.View(shape, dtype)
	if err != nil {
		return nil, fmt.Errorf("alloc_tensor: %w", err)
	}
	if cache && len(s.views) < maxCachedViews {
		s.views = append(s.views, cachedView{offset: offset, dtype: dtype, arr: arr})
	}
	return arr, nil
}

// AllocStats counts an allocator's work. Bytes are the blocks' sizes as
// held from the device.
type AllocStats struct {
	// DeviceAllocs is the number of blocks allocated from the device.
	DeviceAllocs int64
	// Reuses is the number of requests served from the pool.
	Reuses int64
	// LiveBytes is what the allocator holds now: blocks in use by a running
	// invocation plus (pooled) free blocks kept for reuse. Blocks handed
	// to callers inside results are not counted.
	LiveBytes int64
	// PooledBytes is the part of LiveBytes that is free in the pool.
	PooledBytes int64
	// EscapedBytes is the total handed to callers inside results.
	EscapedBytes int64
}

// allocator serves vm.builtin.alloc_storage.
type allocator interface {
	alloc(dev devices.Device, nbytes int64, scope string) (*storage, error)
	// release takes back a block at the end of the invocation that made it.
	release(s *storage)
	// escape gives a block up to the caller.
	escape(s *storage)
	// recycle takes back an escaped block the caller is done with.
	recycle(s *storage)
	// cachesViews reports whether alloc_tensor may reuse a block's views.
	cachesViews() bool
	stats() AllocStats
	// close frees every pooled block.
	close()
}

func newAllocator(cfg string) (allocator, error) {
	switch cfg {
	case MemoryNaive:
		return &naiveAllocator{}, nil
	case MemoryPooled, "":
		return &pooledAllocator{}, nil
	}
	return nil, fmt.Errorf("vm: unknown memory config %q (want %q or %q)", cfg, MemoryNaive, MemoryPooled)
}

func deviceAlloc(dev devices.Device, size, capacity int64, scope string) (*storage, error) {
	if size < 0 {
		return nil, fmt.Errorf("alloc_storage: negative size %d", size)
	}
	buf, err := ndarray.EmptyScoped(ndarray.Shape{capacity}, ndarray.Uint8, dev, scope)
	if err != nil {
		return nil, fmt.Errorf("alloc_storage: %d bytes in scope %q: %w", size, scope, err)
	}
	return &storage{buf: buf, size: size, cap: capacity, dev: dev, scope: scope}, nil
}

type naiveAllocator struct{ st AllocStats }

func (a *naiveAllocator) alloc(dev devices.Device, nbytes int64, scope string) (*storage, error) {
	s, err := deviceAlloc(dev, nbytes, nbytes, scope)
	if err != nil {
		return nil, err
	}
	s.owner = a
	a.st.DeviceAllocs++
	a.st.LiveBytes += s.cap
	return s, nil
}

func (a *naiveAllocator) recycle(s *storage) { _ = s.buf.Release() }

func (a *naiveAllocator) release(s *storage) {
	a.st.LiveBytes -= s.cap
	_ = s.buf.Release()
}

func (a *naiveAllocator) escape(s *storage) {
	a.st.LiveBytes -= s.cap
	a.st.EscapedBytes += s.cap
}

func (a *naiveAllocator) cachesViews() bool { return false }
func (a *naiveAllocator) stats() AllocStats { return a.st }
func (a *naiveAllocator) close()            {}

type pooledAllocator struct {
	free []*storage
	st   AllocStats
}

func roundUp(n int64) int64 {
	if n <= 0 {
		return poolAlign
	}
	if n > (1<<62)-poolAlign {
		return n
	}
	return (n + poolAlign - 1) / poolAlign * poolAlign
}

func (a *pooledAllocator) alloc(dev devices.Device, nbytes int64, scope string) (*storage, error) {
	c := roundUp(nbytes)
	for i := len(a.free) - 1; i >= 0; i-- {
		s := a.free[i]
		if s.cap == c && s.dev == dev && s.scope == scope {
			last := len(a.free) - 1
			a.free[i] = a.free[last]
			a.free[last] = nil
			a.free = a.free[:last]
			s.size = nbytes
			a.st.Reuses++
			a.st.PooledBytes -= s.cap
			return s, nil
		}
	}
	s, err := deviceAlloc(dev, nbytes, c, scope)
	if err != nil {
		return nil, err
	}
	s.owner = a
	a.st.DeviceAllocs++
	a.st.LiveBytes += s.cap
	return s, nil
}

func (a *pooledAllocator) recycle(s *storage) {
	a.st.LiveBytes += s.cap
	a.release(s)
}

func (a *pooledAllocator) release(s *storage) {
	a.free = append(a.free, s)
	a.st.PooledBytes += s.cap
}

func (a *pooledAllocator) escape(s *storage) {
	a.st.LiveBytes -= s.cap
	a.st.EscapedBytes += s.cap
}

func (a *pooledAllocator) cachesViews() bool { return true }
func (a *pooledAllocator) stats() AllocStats { return a.st }

func (a *pooledAllocator) close() {
	for i, s := range a.free {
		_ = s.buf.Release()
		a.st.LiveBytes -= s.cap
		a.st.PooledBytes -= s.cap
		a.free[i] = nil
	}
	a.free = a.free[:0]
}
