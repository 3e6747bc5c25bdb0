package cli

import (
	"context"
	"os"
	"testing"
)

// TestMain lets the test binary stand in for the kiln binary where the
// daemons start subprocesses of it: a compiler node's jobs and a device
// daemon's session workers.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 {
		switch os.Args[1] {
		case "compiler-job", "rpcserver-worker":
			if err := Run(context.Background(), App(), append([]string{"kiln"}, os.Args[1:]...)); err != nil {
				os.Stderr.WriteString(err.Error() + "\n")
				os.Exit(1)
			}
			os.Exit(0)
		}
	}
	os.Exit(m.Run())
}
