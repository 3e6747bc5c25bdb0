// Package devicetest owns the conformance checks every DeviceAPI backend
// passes: allocation and alignment, memory scopes, copies in every
// direction, streams, attributes, NDArrays on the device and concurrent use.
// A backend's tests call Run with its API and one of its devices.
//
// devicetest imports devices, ndarray, the CPU backend (for host memory on
// the other side of copies) and internal/check. Only tests import it.
package devicetest

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"sync"
	"testing"

	"github.com/kiln-ml/kiln/devices"
	_ "github.com/kiln-ml/kiln/devices/cpu" // host memory for copies
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/ndarray"
)

// Option adjusts what Run expects of a backend.
type Option func(*config)

type config struct {
	minAlign   int
	badScopes  []string
	goroutines int
}

// MinAlign says every allocation is aligned to at least n bytes whatever
// alignment was asked for (256 for cuMemAlloc).
func MinAlign(n int) Option { return func(c *config) { c.minAlign = n } }

// BadScopes adds memory scopes that Alloc must refuse with
// devices.ErrBadScope ("nonsense" is always checked).
func BadScopes(scopes ...string) Option {
	return func(c *config) { c.badScopes = append(c.badScopes, scopes...) }
}

// Goroutines sets how many goroutines the concurrency check runs (8 by
// default).
func Goroutines(n int) Option { return func(c *config) { c.goroutines = n } }

// Sizes are the byte counts the copy checks move.
var Sizes = []int64{0, 1, 63, 4096, 1 << 20}

// Run checks that api behaves as a DeviceAPI on dev. The NDArray checks go
// through the registry, so api should be the backend registered for
// dev.Type; they are skipped when it is not.
func Run(t *testing.T, api devices.DeviceAPI, dev devices.Device, opts ...Option) {
	t.Helper()
	cfg := config{minAlign: 1, goroutines: 8}
	for _, o := range opts {
		o(&cfg)
	}
	s := &suite{api: api, dev: dev, cfg: cfg}
	t.Run("Identity", s.identity)
	t.Run("Alloc", s.alloc)
	t.Run("Scopes", s.scopes)
	t.Run("HostRoundTrip", s.hostRoundTrip)
	t.Run("SubRange", s.subRange)
	t.Run("CopyBetween", s.copyBetween)
	t.Run("Streams", s.streams)
	t.Run("Attrs", s.attrs)
	t.Run("NDArray", s.ndarray)
	t.Run("Concurrent", s.concurrent)
}

type suite struct {
	api devices.DeviceAPI
	dev devices.Device
	cfg config
}

// mem allocates nbytes on the device under test and frees it at cleanup.
func (s *suite) mem(t *testing.T, nbytes int64) devices.Ptr {
	t.Helper()
	p, err := s.api.Alloc(s.dev, nbytes, 64, "")
	check.NoError(t, err, "alloc", nbytes, "bytes on", s.dev)
	t.Cleanup(func() {
		if err := s.api.Free(s.dev, p); err != nil {
			t.Errorf("free %d bytes on %s: %v", nbytes, s.dev, err)
		}
	})
	return p
}

// hostMem allocates nbytes of host (C) memory and returns it with a slice
// aliasing it.
func hostMem(t *testing.T, nbytes int64) (devices.Ptr, []byte) {
	t.Helper()
	cpu, err := devices.Get(devices.CPU)
	check.NoError(t, err)
	p, err := cpu.Alloc(devices.CPUDevice, nbytes, 64, "")
	check.NoError(t, err, "host alloc")
	t.Cleanup(func() { _ = cpu.Free(devices.CPUDevice, p) })
	return p, p.HostBytes(nbytes)
}

// pattern returns n bytes that differ for different seeds and offsets.
func pattern(n int64, seed byte) []byte {
	b := make([]byte, n)
	x := uint32(seed)*2654435761 + 1
	for i := range b {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		b[i] = byte(x)
	}
	return b
}

func sameBytes(t *testing.T, got, want []byte, what string) {
	t.Helper()
	if bytes.Equal(got, want) {
		return
	}
	if len(got) != len(want) {
		t.Fatalf("%s: got %d bytes, want %d", what, len(got), len(want))
	}
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("%s: first difference at byte %d of %d: got %#02x, want %#02x", what, i, len(got), got[i], want[i])
		}
	}
}

func (s *suite) identity(t *testing.T) {
	check.Equal(t, s.api.Type(), s.dev.Type, "Type")
	n := s.api.Count()
	check.True(t, n >= 1, fmt.Sprintf("Count is %d, a present backend has at least one device", n))
	check.True(t, int(s.dev.ID) < n, fmt.Sprintf("device %s is beyond Count %d", s.dev, n))
}

func (s *suite) alloc(t *testing.T) {
	for align := 1; align <= 4096; align *= 2 {
		for _, n := range []int64{1, 100, 4097} {
			p, err := s.api.Alloc(s.dev, n, align, "")
			check.NoError(t, err, "alloc", n, "bytes aligned to", align)
			check.True(t, p != 0, "alloc returned a null pointer")
			check.Equal(t, uintptr(p)%uintptr(align), uintptr(0), "pointer", uintptr(p), "aligned to", align)
			check.Equal(t, uintptr(p)%uintptr(s.cfg.minAlign), uintptr(0), "pointer", uintptr(p), "has the backend's minimum alignment", s.cfg.minAlign)
			check.NoError(t, s.api.Free(s.dev, p), "free")
		}
	}
	t.Run("ZeroBytes", func(t *testing.T) {
		p, err := s.api.Alloc(s.dev, 0, 64, "")
		check.NoError(t, err, "alloc of 0 bytes")
		check.NoError(t, s.api.Free(s.dev, p), "free of a 0-byte allocation")
	})
	t.Run("NegativeSize", func(t *testing.T) {
		_, err := s.api.Alloc(s.dev, -1, 64, "")
		check.True(t, err != nil, "alloc of -1 bytes succeeded")
	})
	t.Run("Distinct", func(t *testing.T) {
		seen := map[devices.Ptr]bool{}
		for range 16 {
			p := s.mem(t, 256)
			check.True(t, !seen[p], "two live allocations share address", uintptr(p))
			seen[p] = true
		}
	})
}

func (s *suite) scopes(t *testing.T) {
	for _, scope := range []string{"", "global"} {
		p, err := s.api.Alloc(s.dev, 128, 64, scope)
		check.NoError(t, err, "alloc in scope", fmt.Sprintf("%q", scope))
		check.NoError(t, s.api.Free(s.dev, p))
	}
	for _, scope := range append([]string{"nonsense"}, s.cfg.badScopes...) {
		p, err := s.api.Alloc(s.dev, 128, 64, scope)
		if err == nil {
			_ = s.api.Free(s.dev, p)
		}
		check.ErrorIs(t, err, devices.ErrBadScope)
		check.Error(t, err, scope)
	}
}

func (s *suite) hostRoundTrip(t *testing.T) {
	for i, n := range Sizes {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			p := s.mem(t, n)
			want := pattern(n, byte(i))
			check.NoError(t, s.api.CopyFromHost(p, s.dev, want, 0), "copy from host")
			got := make([]byte, n)
			check.NoError(t, s.api.CopyToHost(got, p, s.dev, 0), "copy to host")
			sameBytes(t, got, want, "host round trip")
		})
	}
}

// subRange writes into the middle of an allocation and checks that only
// those bytes changed: pointer arithmetic on device addresses works.
func (s *suite) subRange(t *testing.T) {
	const n, off, m = 4096, 61, 1000
	p := s.mem(t, n)
	base := pattern(n, 7)
	check.NoError(t, s.api.CopyFromHost(p, s.dev, base, 0))
	patch := pattern(m, 8)
	check.NoError(t, s.api.CopyFromHost(p+off, s.dev, patch, 0))
	want := append([]byte(nil), base...)
	copy(want[off:], patch)
	got := make([]byte, n)
	check.NoError(t, s.api.CopyToHost(got, p, s.dev, 0))
	sameBytes(t, got, want, "after writing a sub-range")
	part := make([]byte, 10)
	check.NoError(t, s.api.CopyToHost(part, p+off+5, s.dev, 0))
	sameBytes(t, part, patch[5:15], "reading a sub-range")
}

func (s *suite) copyBetween(t *testing.T) {
	for i, n := range Sizes {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			want := pattern(n, byte(20+i))
			a, b := s.mem(t, n), s.mem(t, n)
			hin, hinBytes := hostMem(t, n)
			hout, houtBytes := hostMem(t, n)
			copy(hinBytes, want)
			// host -> device, device -> device, device -> host
			check.NoError(t, devices.CopyBetween(a, s.dev, hin, devices.CPUDevice, n, 0), "host to device")
			check.NoError(t, devices.CopyBetween(b, s.dev, a, s.dev, n, 0), "device to device")
			check.NoError(t, devices.CopyBetween(hout, devices.CPUDevice, b, s.dev, n, 0), "device to host")
			sameBytes(t, houtBytes, want, "host -> device -> device -> host")
			// and through the backend directly
			clear(houtBytes)
			check.NoError(t, s.api.Copy(hout, devices.CPUDevice, a, s.dev, n, 0), "api device to host")
			sameBytes(t, houtBytes, want, "api device to host")
		})
	}
}

func (s *suite) streams(t *testing.T) {
	check.NoError(t, s.api.StreamSync(s.dev, 0), "sync of the default stream")
	st, err := s.api.CreateStream(s.dev)
	check.NoError(t, err, "create stream")
	defer func() { check.NoError(t, s.api.FreeStream(s.dev, st), "free stream") }()

	const n = 1 << 16
	want := pattern(n, 42)
	a, b := s.mem(t, n), s.mem(t, n)
	hin, hinBytes := hostMem(t, n)
	hout, houtBytes := hostMem(t, n)
	copy(hinBytes, want)
	check.NoError(t, s.api.Copy(a, s.dev, hin, devices.CPUDevice, n, st), "host to device on a stream")
	check.NoError(t, s.api.Copy(b, s.dev, a, s.dev, n, st), "device to device on a stream")
	check.NoError(t, s.api.Copy(hout, devices.CPUDevice, b, s.dev, n, st), "device to host on a stream")
	check.NoError(t, s.api.StreamSync(s.dev, st), "stream sync")
	sameBytes(t, houtBytes, want, "copies on a stream")

	// Go slices on a stream: the call returns once the copy is done.
	want2 := pattern(n, 43)
	check.NoError(t, s.api.CopyFromHost(a, s.dev, want2, st), "copy from host on a stream")
	got := make([]byte, n)
	check.NoError(t, s.api.CopyToHost(got, a, s.dev, st), "copy to host on a stream")
	check.NoError(t, s.api.StreamSync(s.dev, st))
	sameBytes(t, got, want2, "Go slices through a stream")
}

func (s *suite) attrs(t *testing.T) {
	v, err := s.api.Attr(s.dev, devices.AttrExist)
	check.NoError(t, err, "exist")
	check.Equal(t, v, any(int64(1)), "exist of", s.dev)
	absent := devices.Device{Type: s.dev.Type, ID: int32(s.api.Count())}
	v, err = s.api.Attr(absent, devices.AttrExist)
	check.NoError(t, err, "exist of absent device", absent)
	check.Equal(t, v, any(int64(0)), "exist of", absent)

	v, err = s.api.Attr(s.dev, devices.AttrName)
	check.NoError(t, err, "name")
	name, ok := v.(string)
	check.True(t, ok && name != "", fmt.Sprintf("name is %#v, want a non-empty string", v))

	for _, kind := range append(devices.AllAttrs(), devices.AttrKind(1000)) {
		if kind == devices.AttrExist || kind == devices.AttrName {
			continue
		}
		t.Run(kind.String(), func(t *testing.T) {
			v, err := s.api.Attr(s.dev, kind)
			if err != nil {
				check.ErrorIs(t, err, devices.ErrUnsupportedAttr)
				t.Logf("%s: %v", kind, err)
				return
			}
			switch x := v.(type) {
			case int64:
				check.True(t, x >= 0, fmt.Sprintf("%s is negative: %d", kind, x))
			case string:
				check.True(t, x != "", fmt.Sprintf("%s is an empty string", kind))
			default:
				t.Fatalf("%s is a %T (%v); want int64 or string", kind, v, v)
			}
			t.Logf("%s = %v", kind, v)
		})
	}
}

func (s *suite) ndarray(t *testing.T) {
	if reg, err := devices.Get(s.dev.Type); err != nil || !sameAPI(reg, s.api) {
		t.Skip("the api under test is not the registered backend for", s.dev.Type)
	}
	n := 3 * 5 * 7
	f32 := make([]byte, 4*n)
	for i := range n {
		x := float32(i)*0.25 - 3
		if i == 11 {
			x = float32(math.Inf(-1))
		}
		binary.LittleEndian.PutUint32(f32[4*i:], math.Float32bits(x))
	}
	i8 := make([]byte, n)
	for i := range i8 {
		i8[i] = byte(int8(i - 60))
	}
	tests := []struct {
		name  string
		dtype ndarray.DType
		data  []byte
	}{
		{"float32", ndarray.Float32, f32},
		{"int8", ndarray.Int8, i8},
	}
	shape := ndarray.Shape{3, 5, 7}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a, err := ndarray.Empty(shape, tc.dtype, s.dev)
			check.NoError(t, err, "empty")
			defer a.Release()
			check.Equal(t, a.Device(), s.dev)
			check.NoError(t, a.CopyFromBytes(tc.data), "copy from bytes")
			got, err := a.Bytes()
			check.NoError(t, err, "bytes")
			sameBytes(t, got, tc.data, "Bytes after CopyFromBytes")

			h, err := a.CopyTo(devices.CPUDevice)
			check.NoError(t, err, "copy to cpu")
			defer h.Release()
			hb, err := h.HostBytes()
			check.NoError(t, err)
			sameBytes(t, hb, tc.data, "CopyTo(cpu)")

			b, err := h.CopyTo(s.dev)
			check.NoError(t, err, "copy back to", s.dev)
			defer b.Release()
			c, err := b.CopyTo(s.dev)
			check.NoError(t, err, "copy on", s.dev)
			defer c.Release()
			got, err = c.Bytes()
			check.NoError(t, err)
			sameBytes(t, got, tc.data, "cpu -> device -> device")

			z, err := ndarray.Zeros(shape, tc.dtype, s.dev)
			check.NoError(t, err, "zeros")
			defer z.Release()
			got, err = z.Bytes()
			check.NoError(t, err)
			sameBytes(t, got, make([]byte, len(tc.data)), "zeros")
		})
	}
}

// sameAPI compares two backends without panicking on incomparable ones.
func sameAPI(a, b devices.DeviceAPI) (same bool) {
	defer func() {
		if recover() != nil {
			same = false
		}
	}()
	return a == b
}

// concurrent runs allocation, copies and frees from several goroutines at
// once; run under -race it also checks the backend's own bookkeeping.
func (s *suite) concurrent(t *testing.T) {
	const iters = 20
	var wg sync.WaitGroup
	errs := make(chan error, s.cfg.goroutines)
	for g := range s.cfg.goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := s.worker(g, iters); err != nil {
				errs <- fmt.Errorf("goroutine %d: %w", g, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func (s *suite) worker(g, iters int) (err error) {
	var st devices.Stream
	if g%2 == 1 {
		if st, err = s.api.CreateStream(s.dev); err != nil {
			return fmt.Errorf("create stream: %w", err)
		}
		defer func() {
			if ferr := s.api.FreeStream(s.dev, st); ferr != nil && err == nil {
				err = fmt.Errorf("free stream: %w", ferr)
			}
		}()
	}
	for i := range iters {
		n := int64(1+(g*131+i*977)%8192) * int64(1+i%3)
		want := pattern(n, byte(g*iters+i))
		a, err := s.api.Alloc(s.dev, n, 64, "")
		if err != nil {
			return fmt.Errorf("alloc %d bytes: %w", n, err)
		}
		b, err := s.api.Alloc(s.dev, n, 64, "global")
		if err != nil {
			_ = s.api.Free(s.dev, a)
			return fmt.Errorf("alloc %d bytes: %w", n, err)
		}
		got := make([]byte, n)
		err = errors.Join(
			s.api.CopyFromHost(a, s.dev, want, st),
			s.api.Copy(b, s.dev, a, s.dev, n, st),
			s.api.CopyToHost(got, b, s.dev, st),
			s.api.StreamSync(s.dev, st),
		)
		err = errors.Join(err, s.api.Free(s.dev, a), s.api.Free(s.dev, b))
		if err != nil {
			return fmt.Errorf("iteration %d (%d bytes): %w", i, n, err)
		}
		if !bytes.Equal(got, want) {
			return fmt.Errorf("iteration %d (%d bytes): data came back changed", i, n)
		}
	}
	return nil
}
