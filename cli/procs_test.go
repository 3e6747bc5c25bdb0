package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kiln-ml/kiln/abi"
	"github.com/kiln-ml/kiln/artifact"
	"github.com/kiln-ml/kiln/client"
	"github.com/kiln-ml/kiln/compiler/toolchain"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/rpcserver/proto"
)

// procGuard bounds every wait on a kiln process in the failure tests, so a
// broken daemon fails a test instead of hanging it. It is not a
// performance threshold.
const procGuard = 30 * time.Second

// syncBuffer is a bytes.Buffer safe for one writer and concurrent readers.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// proc is a real kiln process: this test binary run with KILN_TEST_MAIN=1.
type proc struct {
	name string
	cmd  *exec.Cmd
	out  *syncBuffer // stdout and stderr together
	done chan struct{}
	err  error // Wait's result, once done is closed
}

// startProc starts `kiln args...` as a process of its own; it is stopped
// (SIGTERM, then SIGKILL) when the test ends, and its output is logged when
// the test failed.
func startProc(t *testing.T, name string, args ...string) *proc {
	t.Helper()
	return startProcEnv(t, name, nil, args...)
}

// startProcEnv is startProc with env added to the process's environment.
func startProcEnv(t *testing.T, name string, env []string, args ...string) *proc {
	t.Helper()
	exe, err := os.Executable()
	check.NoError(t, err)
	return startProcPath(t, name, exe, env, args...)
}

// startProcPath starts the program at path (this test binary for kiln, or
// another program) as startProc does.
func startProcPath(t *testing.T, name, path string, env []string, args ...string) *proc {
	t.Helper()
	p := &proc{name: name, out: &syncBuffer{}, done: make(chan struct{})}
	p.cmd = exec.Command(path, args...)
	p.cmd.Env = append(os.Environ(), testMainEnv+"=1",
		// A race-enabled binary sleeps a second at exit unless told not to.
		"GORACE="+strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	p.cmd.Env = append(p.cmd.Env, env...)
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	check.NoError(t, p.cmd.Start(), "start", name)
	go func() {
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.stop(t)
		if t.Failed() || os.Getenv("KILN_TEST_LOG") != "" {
			t.Logf("%s (pid %d) output:\n%s", p.name, p.cmd.Process.Pid, p.out.String())
		}
	})
	return p
}

// alive reports whether the process is still running.
func (p *proc) alive() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// kill9 sends SIGKILL and waits for the process to end.
func (p *proc) kill9(t *testing.T) {
	t.Helper()
	p.cmd.Process.Signal(syscall.SIGKILL)
	select {
	case <-p.done:
	case <-time.After(procGuard):
		t.Fatalf("%s did not die of SIGKILL within %s", p.name, procGuard)
	}
}

// stop ends the process as an operator would (SIGTERM), and kills it if it
// has not stopped within the guard.
func (p *proc) stop(t *testing.T) {
	if !p.alive() {
		return
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(procGuard):
		t.Errorf("%s did not stop on SIGTERM within %s", p.name, procGuard)
		p.cmd.Process.Kill()
		<-p.done
	}
}

var listenRE = regexp.MustCompile(`listening on (127\.0\.0\.1:[0-9]+)`)

// addr waits until the process prints the address it listens on.
func (p *proc) addr(t *testing.T) string {
	t.Helper()
	var addr string
	eventually(t, p.name+" prints its address", func() bool {
		if !p.alive() {
			t.Fatalf("%s exited (%v) before listening:\n%s", p.name, p.err, p.out.String())
		}
		m := listenRE.FindStringSubmatch(p.out.String())
		if m != nil {
			addr = m[1]
		}
		return m != nil
	})
	return addr
}

// eventually polls cond every 20 ms until it holds, failing the test after
// procGuard.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(procGuard)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s", what, procGuard)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// procFleet is a tracker, device daemons and a compiler node, each a real
// process on 127.0.0.1, sharing one token.
type procFleet struct {
	t         *testing.T
	dir       string
	tok       string
	tokFile   string
	heartbeat time.Duration

	tracker     *proc
	trackerAddr string
	devices     []*proc
	compiler    *proc
}

// newProcFleet makes the fleet's directory and token file; it starts
// nothing. heartbeat is the tracker's heartbeat interval (a device is lost
// after three missed).
func newProcFleet(t *testing.T, heartbeat time.Duration) *procFleet {
	dir := t.TempDir()
	f := &procFleet{t: t, dir: dir, tok: "failtok", tokFile: filepath.Join(dir, "token"), heartbeat: heartbeat}
	check.NoError(t, os.WriteFile(f.tokFile, []byte(f.tok+"\n"), 0o600))
	return f
}

// startTracker starts `kiln tracker` on addr ("" for a free port; the same
// address again after a restart) with its data in dir/tracker.
func (f *procFleet) startTracker(addr string) {
	t := f.t
	t.Helper()
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	f.tracker = startProc(t, "tracker", "tracker", "--listen", addr, "--data", filepath.Join(f.dir, "tracker"),
		"--token-file", f.tokFile, "--heartbeat", f.heartbeat.String())
	f.trackerAddr = f.tracker.addr(t)
}

// startDevice starts `kiln rpcserver --key key` registered with the
// tracker and returns it once it listens.
func (f *procFleet) startDevice(key string, extra ...string) *proc {
	t := f.t
	t.Helper()
	n := len(f.devices)
	args := append([]string{"rpcserver", "--key", key, "--tracker", f.trackerAddr, "--listen", "127.0.0.1:0",
		"--token-file", f.tokFile, "--dir", filepath.Join(f.dir, fmt.Sprint("device", n))}, extra...)
	p := startProc(t, fmt.Sprintf("device %d (%s)", n, key), args...)
	p.addr(t)
	f.devices = append(f.devices, p)
	return p
}

// startCompiler starts `kiln compiler`.
func (f *procFleet) startCompiler() {
	f.compiler = startProc(f.t, "compiler", "compiler", "--tracker", f.trackerAddr, "--token-file", f.tokFile,
		"--work-dir", filepath.Join(f.dir, "compiler"))
}

// query runs `kiln query --json` against the tracker.
func (f *procFleet) query() proto.TrackerSummary {
	t := f.t
	t.Helper()
	out, errOut, err := runApp(t, "query", "--tracker", f.trackerAddr, "--token-file", f.tokFile, "--json")
	check.NoError(t, err, errOut)
	var s proto.TrackerSummary
	check.NoError(t, json.Unmarshal([]byte(out), &s), out)
	return s
}

// waitFree waits until the tracker counts want free devices under key.
func (f *procFleet) waitFree(key string, want int) {
	f.t.Helper()
	eventually(f.t, fmt.Sprintf("%d free %q device(s)", want, key), func() bool {
		for _, k := range f.query().Keys {
			if k.Key == key {
				return k.Free == want
			}
		}
		return false
	})
}

// deviceState returns the tracker's state of the device listening on addr
// ("" when the tracker does not know it).
func (f *procFleet) deviceState(addr string) proto.NodeState {
	_, port, _ := net.SplitHostPort(addr)
	for _, n := range f.query().Devices {
		if _, p, _ := net.SplitHostPort(n.Addr); p == port {
			return n.State
		}
	}
	return ""
}

// deviceAt returns the device process listening on addr.
func (f *procFleet) deviceAt(addr string) *proc {
	f.t.Helper()
	_, port, _ := net.SplitHostPort(addr)
	for _, d := range f.devices {
		if _, p, _ := net.SplitHostPort(d.addr(f.t)); p == port {
			return d
		}
	}
	f.t.Fatalf("no device process listens on %s", addr)
	return nil
}

// dialTracker connects the SDK to the tracker; closed when the test ends.
func (f *procFleet) dialTracker(ctx context.Context) *client.Tracker {
	f.t.Helper()
	tc, err := client.DialTracker(ctx, f.trackerAddr, client.TrackerOptions{Token: f.tok})
	check.NoError(f.t, err)
	f.t.Cleanup(func() { tc.Close() })
	return tc
}

// failKernelsC are the failure tests' kernels (ABI of abi/kiln_abi.h): a
// good one, one that segfaults and one that sleeps.
const failKernelsC = `#include <stdint.h>
#include <time.h>
#include "kiln_abi.h"

KILN_DEFINE_LAST_ERROR()

// vadd4: C = A + B for float32[4].
KILN_EXPORT int32_t vadd4(KilnValue* args, int32_t* codes, int32_t n) {
  if (n != 3) { kiln_set_last_error("vadd4: want 3 arguments"); return 1; }
  DLTensor* a = (DLTensor*)args[0].v_handle;
  DLTensor* b = (DLTensor*)args[1].v_handle;
  DLTensor* c = (DLTensor*)args[2].v_handle;
  const float* pa = (const float*)((char*)a->data + a->byte_offset);
  const float* pb = (const float*)((char*)b->data + b->byte_offset);
  float* pc = (float*)((char*)c->data + c->byte_offset);
  for (int i = 0; i < 4; i++) pc[i] = pa[i] + pb[i];
  return 0;
}

// A volatile null pointer, so the compiler cannot see the fault coming.
static int* volatile nullp = 0;

// segv writes through a null pointer: SIGSEGV.
KILN_EXPORT int32_t segv(KilnValue* args, int32_t* codes, int32_t n) {
  *nullp = 42;
  return 0;
}

// sleep_ms sleeps for its argument in milliseconds.
KILN_EXPORT int32_t sleep_ms(KilnValue* args, int32_t* codes, int32_t n) {
  int64_t ms = args[0].v_int64;
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0) {}
  return 0;
}

KILN_EXPORT const char* kiln_module_metadata(void) {
  return "{\"format_version\":1,\"target\":\"c\",\"functions\":["
         "{\"name\":\"vadd4\",\"params\":["
         "{\"name\":\"A\",\"kind\":\"tensor\",\"dtype\":\"float32\",\"shape\":[4]},"
         "{\"name\":\"B\",\"kind\":\"tensor\",\"dtype\":\"float32\",\"shape\":[4]},"
         "{\"name\":\"C\",\"kind\":\"tensor\",\"dtype\":\"float32\",\"shape\":[4]}]},"
         "{\"name\":\"segv\",\"params\":[]},"
         "{\"name\":\"sleep_ms\",\"params\":[{\"name\":\"ms\",\"kind\":\"int\"}]}"
         "]}";
}
`

var (
	failKernelsOnce sync.Once
	failKernelsArt  []byte
	failKernelsErr  error
)

// failKernels returns failKernelsC built into a .kiln artifact (built once
// per test binary); the test is skipped without a C compiler.
func failKernels(t *testing.T) []byte {
	t.Helper()
	failKernelsOnce.Do(func() { failKernelsArt, failKernelsErr = buildFailKernels() })
	if failKernelsErr != nil {
		t.Skipf("no C toolchain to build the test kernels: %v", failKernelsErr)
	}
	return failKernelsArt
}

func buildFailKernels() ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), procGuard)
	defer cancel()
	tc, err := toolchain.Find(ctx, toolchain.Options{Flags: []string{"-O1"}})
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "kiln-fail-kernels-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	so := filepath.Join(dir, "kernels.so")
	if err := tc.BuildShared(ctx, []toolchain.Source{{Name: "kernels.c", Text: failKernelsC}}, so, ""); err != nil {
		return nil, err
	}
	b, err := os.ReadFile(so)
	if err != nil {
		return nil, err
	}
	a := artifact.New("c", tc.Identity())
	if err := a.Add(artifact.HostLib, b); err != nil {
		return nil, err
	}
	a.Manifest.Functions = []abi.FuncInfo{
		{Name: "vadd4", Params: []abi.ParamInfo{
			{Name: "A", Kind: abi.ParamTensor, DType: "float32", Shape: []abi.Dim{{Value: 4}}},
			{Name: "B", Kind: abi.ParamTensor, DType: "float32", Shape: []abi.Dim{{Value: 4}}},
			{Name: "C", Kind: abi.ParamTensor, DType: "float32", Shape: []abi.Dim{{Value: 4}}},
		}},
		{Name: "segv", Params: []abi.ParamInfo{}},
		{Name: "sleep_ms", Params: []abi.ParamInfo{{Name: "ms", Kind: abi.ParamInt}}},
	}
	return a.Bytes()
}

// writeFailKernels writes the kernels' artifact into dir and returns its path.
func writeFailKernels(t *testing.T, dir string) string {
	t.Helper()
	p := filepath.Join(dir, "kernels.kiln")
	check.NoError(t, os.WriteFile(p, failKernels(t), 0o644))
	return p
}
