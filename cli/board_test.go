package cli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/kiln-ml/kiln/client"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/internal/exectest"
	"github.com/kiln-ml/kiln/ndarray"
	"github.com/kiln-ml/kiln/rpcserver/proto"
)

// emulatedBoard is an architecture the tests run a board daemon for under
// qemu-user: kiln cross-built with its cgo C compiler.
type emulatedBoard struct {
	goarch, triple, qemu string
	// targets are the target strings the vectorized kernel is built for:
	// each board's vector widths (NEON, SVE; RVV and scalar RISC-V).
	targets []string
}

var emulatedBoards = []emulatedBoard{
	{"arm64", "aarch64-linux-gnu", "qemu-aarch64", []string{
		"cpu -mtriple=aarch64-linux-gnu -mcpu=cortex-a72",
		"cpu -mtriple=aarch64-linux-gnu -mcpu=neoverse-n1",
		"cpu -mtriple=aarch64-linux-gnu -mattr=+sve",
	}},
	{"riscv64", "riscv64-linux-gnu", "qemu-riscv64", []string{
		"cpu -mtriple=riscv64-linux-gnu",
		"cpu -mtriple=riscv64-linux-gnu -mattr=+v",
	}},
}

// TestEmulatedBoards runs, for ARM64 and RISC-V, the cross-compilation
// workflow of a board that cannot compile for itself: an x86 tracker and
// compiler node (this machine), and a `kiln rpcserver` cross-built for the
// board and run under qemu-user, its session workers too (through
// --worker-wrapper). A build for the board's triple goes through the
// tracker's queue, the compiler node cross-compiles it, the board runs it
// and the result is checked; the time evaluator answers and says its times
// are emulated. A vectorized kernel is run for each of the board's vector
// widths, and on ARM64 the IRModule tutorial's MLP with its weights.
func TestEmulatedBoards(t *testing.T) {
	if testing.Short() {
		t.Skip("cross-builds kiln and runs it under qemu (-short)")
	}
	if runtime.GOARCH != "amd64" {
		t.Skip("the emulated boards are run from an amd64 machine")
	}
	f := newProcFleet(t, 500*time.Millisecond)
	f.startTracker("")
	f.startCompiler()
	eventually(t, "the compiler node registered", func() bool { return len(f.query().Compiler) == 1 })

	// A target no compiler node builds fails at once, naming what the
	// nodes build, and query lists the job failed with that message.
	_, _, err := runApp(t, "build", "testdata/vadd.py", "--tracker", f.trackerAddr, "--token-file", f.tokFile,
		"--target", "cpu -mtriple=mips-linux-gnu", "-o", filepath.Join(t.TempDir(), "mips.kiln"))
	check.Error(t, err, `no compiler node can build target "cpu -mtriple=mips-linux-gnu"; nodes serve: cpu (x86_64-linux-gnu)`)
	q, errOut, err := runApp(t, "query", "--tracker", f.trackerAddr, "--token-file", f.tokFile)
	check.NoError(t, err, errOut)
	check.True(t, strings.Contains(q, `failed`) && strings.Contains(q, `no compiler node can build target "cpu -mtriple=mips-linux-gnu"`), q)

	for _, b := range emulatedBoards {
		t.Run(b.goarch, func(t *testing.T) {
			for _, tool := range []string{b.qemu, b.triple + "-gcc", "go"} {
				if _, err := exec.LookPath(tool); err != nil {
					t.Skipf("%s not found: install qemu-user and gcc-%s (Debian) to run the %s board", tool, b.triple, b.goarch)
				}
			}
			sysroot := "/usr/" + b.triple
			if _, err := os.Stat(sysroot); err != nil {
				t.Skipf("%s not found: install libc6-dev-%s-cross", sysroot, map[string]string{"arm64": "arm64", "riscv64": "riscv64"}[b.goarch])
			}
			exe := crossBuildKiln(t, b)
			wrapper := b.qemu + " -L " + sysroot
			key := "board-" + b.goarch
			dev := startCommand(t, key, b.qemu, "-L", sysroot, exe, "rpcserver", "--key", key,
				"--tracker", f.trackerAddr, "--listen", "127.0.0.1:0", "--token-file", f.tokFile,
				"--dir", filepath.Join(f.dir, key), "--worker-wrapper", wrapper)
			dev.addr(t)
			f.waitFree(key, 1)

			// query groups the board under its architecture and says it
			// is emulated.
			q, errOut, err := runApp(t, "query", "--tracker", f.trackerAddr, "--token-file", f.tokFile)
			check.NoError(t, err, errOut)
			grouped := false
			for _, line := range strings.Split(q, "\n") {
				fl := strings.Fields(line)
				grouped = grouped || (len(fl) >= 3 && fl[0] == b.goarch && fl[1] == key && fl[2] == "1")
			}
			check.True(t, grouped, "query groups", key, "under", b.goarch, ":", q)
			check.True(t, strings.Contains(q, "(emulated: "+b.qemu+")"), q)

			dir := t.TempDir()
			art := filepath.Join(dir, "vadd.kiln")
			_, errOut, err = runApp(t, "build", "testdata/vadd.py", "--tracker", f.trackerAddr, "--token-file", f.tokFile,
				"--target", "cpu -mtriple="+b.triple, "-o", art)
			check.NoError(t, err, errOut)

			x := make([]float32, 1024)
			for i := range x {
				x[i] = float32(i) / 4
			}
			xa, err := ndarray.FromSlice(x, ndarray.Shape{1024})
			check.NoError(t, err)
			in := filepath.Join(dir, "x.npy")
			check.NoError(t, ndarray.SaveNPY(in, xa))
			y := make([]float32, 1024)
			for i := range y {
				y[i] = float32(512-i) / 8
			}
			ya, err := ndarray.FromSlice(y, ndarray.Shape{1024})
			check.NoError(t, err)
			yin := filepath.Join(dir, "y.npy")
			check.NoError(t, ndarray.SaveNPY(yin, ya))
			out := filepath.Join(dir, "out")
			_, errOut, err = runApp(t, "run", art, "--tracker", f.trackerAddr, "--key", key, "--token-file", f.tokFile,
				"--input", "A="+in, "--input", "B="+in, "--output", out)
			check.NoError(t, err, errOut)
			c, err := ndarray.LoadNPY(filepath.Join(out, "C.npy"))
			check.NoError(t, err)
			got, err := ndarray.ToSlice[float32](c)
			check.NoError(t, err)
			for i := range got {
				if got[i] != 2*x[i] {
					t.Fatalf("%s board: C[%d] = %g, want %g", b.goarch, i, got[i], 2*x[i])
				}
			}

			// The board is found by its architecture as well as by its key.
			js, errOut, err := runApp(t, "bench", art, "--tracker", f.trackerAddr, "--selector", "arch="+b.goarch+",cores>=1", "--token-file", f.tokFile,
				"--input", "A="+in, "--input", "B="+in, "--repeat", "2", "--min-repeat-ms", "1", "--json")
			check.NoError(t, err, errOut)
			var res proto.TimeResult
			check.NoError(t, json.Unmarshal([]byte(js), &res), js)
			check.Equal(t, len(res.Results), 2)
			check.Equal(t, res.Emulated, b.qemu)
			table, errOut, err := runApp(t, "bench", art, "--tracker", f.trackerAddr, "--key", key, "--token-file", f.tokFile,
				"--input", "A="+in, "--input", "B="+in, "--repeat", "1", "--min-repeat-ms", "1")
			check.NoError(t, err, errOut)
			check.True(t, strings.Contains(table, "note: the device runs under "+b.qemu+": these are emulated times"), table)
			t.Logf("%s board under %s: vadd of 1024 floats %.1f µs per call (emulated: not a performance figure)", b.goarch, b.qemu, res.Median*1e6)

			// A vectorized kernel built for each of the board's vector
			// widths gives the right numbers on it.
			for _, target := range b.targets {
				vart := filepath.Join(dir, "vfma.kiln")
				_, errOut, err := runApp(t, "build", "testdata/vfma.py", "--tracker", f.trackerAddr, "--token-file", f.tokFile,
					"--target", target, "-o", vart)
				check.NoError(t, err, errOut)
				vout := filepath.Join(dir, "vout")
				_, errOut, err = runApp(t, "run", vart, "--tracker", f.trackerAddr, "--key", key, "--token-file", f.tokFile,
					"--input", "A="+in, "--input", "B="+yin, "--output", vout)
				check.NoError(t, err, target, errOut)
				c, err := ndarray.LoadNPY(filepath.Join(vout, "C.npy"))
				check.NoError(t, err)
				got, err := ndarray.ToSlice[float32](c)
				check.NoError(t, err)
				for i := range got {
					if want := x[i]*y[i] + max(x[i], y[i]); got[i] != want {
						t.Fatalf("%s on the %s board: C[%d] = %g, want %g", target, b.goarch, i, got[i], want)
					}
				}
			}

			// The IRModule tutorial's MLP, a graph module, with its weights.
			if b.goarch == "arm64" {
				mdir := t.TempDir()
				src, pfile, xfile, checkOut := mlpFiles(t, mdir)
				mart := filepath.Join(mdir, "mlp.kiln")
				_, errOut, err := runApp(t, "build", src, "--tracker", f.trackerAddr, "--token-file", f.tokFile,
					"--target", "cpu -mtriple="+b.triple+" -mcpu=cortex-a72", "-o", mart)
				check.NoError(t, err, errOut)
				mout := filepath.Join(mdir, "out")
				_, errOut, err = runApp(t, "run", mart, "--tracker", f.trackerAddr, "--key", key, "--token-file", f.tokFile,
					"--input", "x="+xfile, "--params", pfile, "--output", mout)
				check.NoError(t, err, errOut)
				checkOut(filepath.Join(mout, "output.npy"))
			}

			// An artifact for this machine is refused when it asks for the
			// board, naming both architectures: the tracker knows both.
			host := filepath.Join(dir, "host.kiln")
			_, errOut, err = runApp(t, "build", "testdata/vadd.py", "-o", host)
			check.NoError(t, err, errOut)
			_, _, err = runApp(t, "run", host, "--tracker", f.trackerAddr, "--key", key, "--token-file", f.tokFile,
				"--input", "A="+in, "--input", "B="+in, "--output", out)
			check.ErrorIs(t, err, proto.ErrBadRequest)
			check.Error(t, err, "the artifact is built for amd64", fmt.Sprintf("every device registered under key %q is %s", key, b.goarch))

			if b.goarch == "arm64" {
				boardDies(t, f, dev, key, b, dir)
			}
		})
	}
}

// boardDies kills the board's qemu (its daemon) in the middle of a run: the
// client's run fails naming the board, the tracker marks the board lost,
// and the build queue goes on serving (the next build for the board's
// triple succeeds).
func boardDies(t *testing.T, f *procFleet, dev *proc, key string, b emulatedBoard, dir string) {
	t.Helper()
	art := filepath.Join(dir, "mm.kiln")
	_, errOut, err := runApp(t, "build", "testdata/mm1024.py", "--tracker", f.trackerAddr, "--token-file", f.tokFile,
		"--target", "cpu -mtriple="+b.triple, "-o", art)
	check.NoError(t, err, errOut)
	ones := make([]float32, 1024*1024)
	for i := range ones {
		ones[i] = 1
	}
	oa, err := ndarray.FromSlice(ones, ndarray.Shape{1024, 1024})
	check.NoError(t, err)
	in := filepath.Join(dir, "ones.npy")
	check.NoError(t, ndarray.SaveNPY(in, oa))
	opened := strings.Count(dev.out.String(), "session open")
	runErr := make(chan error, 1)
	go func() {
		// A naive 1024³ matmul: seconds under qemu.
		_, _, err := runApp(t, "run", art, "--tracker", f.trackerAddr, "--key", key, "--token-file", f.tokFile,
			"--input", "A="+in, "--input", "B="+in, "--output", filepath.Join(dir, "mm-out"))
		runErr <- err
	}()
	eventually(t, "the run's session opened", func() bool { return strings.Count(dev.out.String(), "session open") > opened })
	time.Sleep(300 * time.Millisecond) // into the upload or the call
	dev.kill9(t)
	select {
	case err := <-runErr:
		check.Error(t, err, "the device at", key, "stopped answering in the middle of the session (its daemon died or the connection broke)")
	case <-time.After(procGuard):
		t.Fatalf("the run on a board that died did not end within %s", procGuard)
	}
	eventually(t, "the dead board is lost", func() bool {
		for _, n := range f.query().Devices {
			if n.Key == key {
				return n.State == proto.StateLost
			}
		}
		return false
	})
	_, errOut, err = runApp(t, "build", "testdata/vadd.py", "--tracker", f.trackerAddr, "--token-file", f.tokFile,
		"--target", "cpu -mtriple="+b.triple+" -mcpu=cortex-a53", "-o", filepath.Join(dir, "after.kiln"))
	check.NoError(t, err, "a build after the board died:", errOut)
}

// crossBuildLimit bounds one cross-build of kiln (cut to end before the
// test binary's own -timeout).
const crossBuildLimit = 20 * time.Minute

// crossBuildKiln builds kiln for b the way a release is built: with
// scripts/release (cgo and b's cross compiler), whose SHA256SUMS must list
// the binary with its hash.
func crossBuildKiln(t *testing.T, b emulatedBoard) string {
	t.Helper()
	dir := t.TempDir()
	cmd := exec.Command("bash", "../scripts/release", "--out", dir, "linux/"+b.goarch)
	cmd.Env = append(os.Environ(), "GOFLAGS=")
	// A cold cross-build compiles all of kiln and its dependencies for the
	// board: minutes on a loaded two-core machine.
	out, err := exectest.CombinedOutput(t, crossBuildLimit, cmd)
	if err != nil {
		t.Fatalf("cross-building kiln for the %s board: %v\n%s", b.goarch, err, out)
	}
	name := "kiln-linux-" + b.goarch
	exe := filepath.Join(dir, name)
	check.Equal(t, strings.TrimSpace(string(out[bytes.LastIndexByte(bytes.TrimSpace(out), '\n')+1:])), exe)
	sums, err := os.ReadFile(filepath.Join(dir, "SHA256SUMS"))
	check.NoError(t, err)
	sha, _, err := client.FileSHA256(exe)
	check.NoError(t, err)
	check.True(t, strings.Contains(string(sums), sha+"  "+name+"\n"), "SHA256SUMS lists", name, "with its hash:", string(sums))
	return exe
}

// startCommand starts a program (not this test binary) as a fleet process
// with the same life and logging as startProc.
func startCommand(t *testing.T, name, path string, args ...string) *proc {
	t.Helper()
	return startProcPath(t, name, path, nil, args...)
}
