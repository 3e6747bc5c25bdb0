package cli

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kiln-ml/kiln/client"
	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/rpcserver/proto"
)

// TestBuildOptionsCannotRunCommands: a member of the fleet submits build
// jobs whose options would make the compiler node's C compiler run a
// shell (a client-chosen compiler, GCC's -wrapper): the jobs fail naming
// the option, and nothing ran.
func TestBuildOptionsCannotRunCommands(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir := t.TempDir()
	fl, _ := testFleet(t, dir, "tok")
	src, err := os.ReadFile("testdata/vadd.py")
	check.NoError(t, err)
	marker := filepath.Join(dir, "pwned")
	for _, tc := range []struct {
		name    string
		options map[string]string
		want    string
	}{
		{"client-chosen compiler", map[string]string{"cc": "sh", "cflags": "-c >" + marker}, "cc="},
		{"gcc wrapper", map[string]string{"cflags": "-O2 -wrapper /bin/sh,-c,>" + marker}, `"-wrapper"`},
		{"spec file", map[string]string{"cflags": "-specs=" + marker}, "-specs="},
	} {
		t.Run(tc.name, func(t *testing.T) {
			job, err := fl.client.SubmitBuild(ctx, proto.BuildSubmitArgs{Name: "vadd.py", Module: string(src), Target: "cpu", Options: tc.options})
			check.NoError(t, err)
			job, err = fl.client.WaitBuild(ctx, job.ID, nil)
			check.ErrorIs(t, err, client.ErrBuildFailed)
			check.True(t, strings.Contains(job.Error, tc.want), "job error:", job.Error)
			_, err = os.Stat(marker)
			check.True(t, os.IsNotExist(err), "the build job ran a command on the compiler node")
		})
	}
}
