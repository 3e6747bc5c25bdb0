//go:build linux

// Package docker holds kiln's container files; its test builds the images
// with buildah (docker/build.sh) and runs them together (docker/smoke.sh).
package docker

import (
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/kiln-ml/kiln/internal/exectest"
)

// TestImages builds the tracker, compiler and device-cpu images from
// Debian base images made here (no registry is needed) and smoke-runs them:
// a remote build, run and timing through the three images' daemons.
//
// It takes minutes, so it runs only with KILN_IMAGE_TEST=1 (.ci/run sets it
// in a step of its own, after the other tests); it needs root, buildah,
// mmdebstrap, umoci, unshare, chroot, Go and python3 with numpy, and with
// KILN_IMAGE_TEST=1 a missing one is a failure that names it.
func TestImages(t *testing.T) {
	if os.Getenv("KILN_IMAGE_TEST") != "1" {
		t.Skip("skipping the container image build and smoke run: it takes minutes; run it with KILN_IMAGE_TEST=1 go test -run TestImages ./docker/ (.ci/run does)")
	}
	need := func(why string) {
		t.Helper()
		t.Fatalf("cannot build and run the images: %s", why)
	}
	if os.Getuid() != 0 {
		need("it needs root (chroot and namespaces)")
	}
	for _, tool := range []string{"buildah", "mmdebstrap", "umoci", "unshare", "chroot", "python3", "go"} {
		if _, err := exec.LookPath(tool); err != nil {
			need(tool + " is not installed (Debian: apt-get install buildah mmdebstrap umoci)")
		}
	}
	end := time.Now().Add(25 * time.Minute)
	run := func(name string, args ...string) {
		t.Helper()
		cmd := exec.Command(name, args...)
		cmd.Dir = ".."
		start := time.Now()
		out, err := exectest.CombinedOutput(t, time.Until(end), cmd)
		t.Logf("%s (%s):\n%s", name, time.Since(start).Round(time.Second), out)
		if err != nil {
			t.Fatal(err)
		}
	}
	run("docker/build.sh", "--local-base", "--go-cache", "tracker", "compiler", "device-cpu")
	run("docker/smoke.sh")
}
