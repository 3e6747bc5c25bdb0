package vm_test

import (
	"runtime"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kiln-ml/kiln/devices"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/vm"
)

// TestInvokeOneThread: every kernel call of an invocation runs on the OS
// thread the invocation started on (OpenMP keeps a team of spinning
// workers per calling thread), even when the calls block in system calls
// and other goroutines keep every P busy.
func TestInvokeOneThread(t *testing.T) {
	var tids []int
	register(t, "test.tid", func() int64 {
		tids = append(tids, syscall.Gettid())
		// A blocking system call, as a long kernel call is: the P is
		// handed to another thread meanwhile.
		ts := syscall.NsecToTimespec(int64(200 * time.Microsecond))
		syscall.Nanosleep(&ts, nil)
		runtime.Gosched()
		return 0
	})
	b := vm.NewBuilder()
	main := b.Function("main")
	for range 20 {
		main.CallTo(vm.NoReg, "test.tid")
	}
	main.Ret(main.Call("test.tid"))
	exe, err := b.Build()
	check.NoError(t, err)
	m, err := vm.New(exe, nil, devices.CPUDevice, vm.Options{})
	check.NoError(t, err)
	defer m.Close()

	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range runtime.GOMAXPROCS(0) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
			}
		}()
	}
	defer wg.Wait()
	defer close(stop)
	for range 3 {
		tids = tids[:0]
		_, err := m.Invoke("main")
		check.NoError(t, err)
		check.Equal(t, len(tids), 21)
		for _, tid := range tids {
			check.Equal(t, tid, tids[0])
		}
	}
}
