package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/rpcserver"
)

// runApp runs the CLI in-process with captured output.
func runApp(t *testing.T, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	var out, errOut bytes.Buffer
	app := App()
	app.Writer, app.ErrWriter = &out, &errOut
	err = Run(context.Background(), app, append([]string{"kiln"}, args...))
	return out.String(), errOut.String(), err
}

func TestVersion(t *testing.T) {
	out, _, err := runApp(t, "version")
	check.NoError(t, err)
	for _, want := range []string{"kiln", Version(), runtime.Version(), runtime.GOOS + "/" + runtime.GOARCH, "abi"} {
		check.True(t, strings.Contains(out, want), "version output lacks", want, "in", out)
	}
}

func TestVersionStamp(t *testing.T) {
	old := version
	t.Cleanup(func() { version = old })
	version = "v1.2.3"
	check.Equal(t, Version(), "v1.2.3")
	version = ""
	check.True(t, strings.HasPrefix(Version(), devVersion), Version())
}

func TestDevicesTable(t *testing.T) {
	out, _, err := runApp(t, "devices")
	check.NoError(t, err)
	lines := strings.Split(out, "\n")
	check.True(t, strings.HasPrefix(lines[0], "DEVICE"), "header:", lines[0])
	check.True(t, strings.HasPrefix(lines[1], "cpu:0"), "first device:", lines[1])
	for _, want := range []string{"name", "exist", "triple", "features"} {
		check.True(t, strings.Contains(out, want), "devices output lacks", want, "in", out)
	}
}

func TestDevicesJSON(t *testing.T) {
	out, _, err := runApp(t, "devices", "--json")
	check.NoError(t, err)
	var r struct {
		Host struct {
			Triple string `json:"triple"`
		} `json:"host"`
		Devices []struct {
			Device string         `json:"device"`
			Type   string         `json:"type"`
			Attrs  map[string]any `json:"attrs"`
		} `json:"devices"`
		Absent map[string]string `json:"absent"`
	}
	check.NoError(t, json.Unmarshal([]byte(out), &r), "output:", out)
	check.True(t, r.Host.Triple != "", "empty host triple")
	check.True(t, r.Absent != nil, "absent is null, want an object")
	var found bool
	for _, d := range r.Devices {
		if d.Device != "cpu:0" {
			continue
		}
		found = true
		check.Equal(t, d.Type, "cpu")
		name, _ := d.Attrs["name"].(string)
		check.True(t, name != "", "cpu:0 has no name:", d.Attrs)
		check.Equal(t, d.Attrs["exist"], any(1.0))
	}
	check.True(t, found, "no cpu:0 in", out)
	// CUDA is compiled in: it is either listed or absent with a reason.
	var cuda bool
	for _, d := range r.Devices {
		cuda = cuda || d.Type == "cuda"
	}
	check.True(t, cuda || r.Absent["cuda"] != "", "cuda neither listed nor absent in", out)
}

func TestErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want []string
	}{
		{"unknown command", []string{"frobnicate"}, []string{`unknown command "frobnicate"`}},
		{"unknown flag", []string{"devices", "--yaml"}, []string{"devices", "yaml", "kiln devices --help"}},
		{"unexpected argument", []string{"version", "now"}, []string{`unexpected argument "now"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, _, err := runApp(t, tc.args...)
			check.Error(t, err, tc.want...)
			check.Equal(t, out, "")
		})
	}
}

func TestHelp(t *testing.T) {
	for _, args := range [][]string{nil, {"--help"}, {"devices", "--help"}, {"help", "version"}} {
		out, _, err := runApp(t, args...)
		check.NoError(t, err, args)
		check.True(t, strings.Contains(out, "USAGE:"), args, "help lacks USAGE:", out)
	}
}

func TestDeviceTableAbsent(t *testing.T) {
	var out bytes.Buffer
	r := devicesReport{Absent: map[string]string{"cuda": "libcuda.so.1 not found", "opencl": "not built in"}}
	check.NoError(t, writeDeviceTable(&out, r))
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	check.Equal(t, len(lines), 3, out.String())
	check.True(t, strings.HasPrefix(lines[1], "cuda") && strings.HasSuffix(lines[1], "absent: libcuda.so.1 not found"), lines[1])
	check.True(t, strings.HasPrefix(lines[2], "opencl"), lines[2])
}

func TestHumanBytes(t *testing.T) {
	for n, want := range map[int64]string{512: "512 B", 2048: "2.0 KiB", 3 << 30: "3.0 GiB", 1536 << 20: "1.5 GiB"} {
		check.Equal(t, humanBytes(n), want)
	}
}

// testFleet starts an in-process fleet (tracker, compiler node and CPU
// device daemon on loopback) with its files in dir and the token tok,
// stopped when the test ends, and writes tok to dir/token; it returns the
// fleet and that file.
func testFleet(t *testing.T, dir, tok string) (*fleet, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	exe, err := os.Executable()
	check.NoError(t, err)
	fl, err := startFleet(ctx, dir, tok, rpcserver.WorkerSpec{Path: exe}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	check.NoError(t, err)
	t.Cleanup(func() {
		check.NoError(t, fl.stop())
		cancel()
	})
	tokFile := filepath.Join(dir, "token")
	check.NoError(t, os.WriteFile(tokFile, []byte(tok+"\n"), 0o600))
	return fl, tokFile
}
