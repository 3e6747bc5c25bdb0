package ndarray

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/kiln-ml/kiln/devices"
)

// compactHostBytes returns a's elements in row-major order as host bytes.
// For a contiguous CPU array the slice aliases the storage: the caller
// keeps a alive (runtime.KeepAlive) while it uses the slice and must not
// write to it. Other arrays are copied; a strided view is gathered.
func compactHostBytes(a *NDArray) ([]byte, error) {
	if err := a.check(); err != nil {
		return nil, err
	}
	if a.IsContiguous() {
		if a.Device().Type == devices.CPU {
			return a.Data().HostBytes(a.NumBytes()), nil
		}
		return a.Bytes()
	}
	es := int64(a.dtype.Size())
	n := a.NumElements()
	out := make([]byte, n*es)
	if n == 0 {
		return out, nil
	}
	// The span of storage the view addresses, in elements relative to
	// element zero.
	lo, hi := int64(0), int64(0)
	for i, s := range a.strides {
		if ext := (a.shape[i] - 1) * s; ext < 0 {
			lo += ext
		} else {
			hi += ext
		}
	}
	start, span := a.offset+lo*es, (hi-lo+1)*es
	if start < 0 || span <= 0 || start > a.st.a.nbytes || span > a.st.a.nbytes-start {
		return nil, fmt.Errorf("array with shape %s strides %v at offset %d reaches outside %d bytes of storage", a.shape, a.strides, a.offset, a.st.a.nbytes)
	}
	var src []byte
	p := a.st.a.ptr + devices.Ptr(start)
	if a.Device().Type == devices.CPU {
		src = p.HostBytes(span)
	} else {
		src = make([]byte, span)
		if err := a.st.a.api.CopyToHost(src, p, a.Device(), 0); err != nil {
			return nil, err
		}
	}
	idx := make([]int64, len(a.shape))
	pos := -lo * es // element zero's byte position in src
	for k := int64(0); k < n; k++ {
		if pos < 0 || pos > span-es {
			return nil, fmt.Errorf("array with shape %s strides %v: element %d lies outside the storage", a.shape, a.strides, k)
		}
		copy(out[k*es:(k+1)*es], src[pos:pos+es])
		for d := len(idx) - 1; d >= 0; d-- {
			idx[d]++
			pos += a.strides[d] * es
			if idx[d] < a.shape[d] {
				break
			}
			pos -= a.shape[d] * a.strides[d] * es
			idx[d] = 0
		}
	}
	return out, nil
}

// writeFileAtomic writes path through write: into a temporary file in the
// same directory, synced and then renamed over path, so that a crash
// leaves either the old file or the whole new one, never half of it.
func writeFileAtomic(path string, write func(io.Writer) error) (err error) {
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	f, err := os.CreateTemp(dir, "."+base+".tmp-*")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			_ = f.Close()
			_ = os.Remove(f.Name())
		}
	}()
	bw := bufio.NewWriterSize(f, 1<<20)
	if err = write(bw); err != nil {
		return err
	}
	if err = bw.Flush(); err != nil {
		return err
	}
	if err = f.Chmod(0o644); err != nil {
		return err
	}
	if err = f.Sync(); err != nil {
		return err
	}
	if err = f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}
