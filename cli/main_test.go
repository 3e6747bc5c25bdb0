package cli

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"testing"
)

// testMainEnv makes this test binary run the whole kiln app on its
// arguments, as cmd/kiln does: the failure tests start real `kiln tracker`,
// `kiln rpcserver` and `kiln compiler` processes from os.Executable().
const testMainEnv = "KILN_TEST_MAIN"

// TestMain lets the test binary stand in for the kiln binary where the
// daemons start subprocesses of it: a compiler node's jobs and a device
// daemon's session workers. With KILN_TEST_MAIN=1 in the environment it is
// the kiln binary, whatever its arguments.
func TestMain(m *testing.M) {
	if os.Getenv(testMainEnv) == "1" {
		os.Exit(kilnMain(os.Args[1:]))
	}
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

// kilnMain is cmd/kiln's main: the app under a context cancelled by
// SIGINT or SIGTERM; it returns the exit status.
func kilnMain(args []string) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := Run(ctx, App(), append([]string{"kiln"}, args...))
	stop()
	if err != nil {
		fmt.Fprintf(os.Stderr, "kiln: %v\n", err)
		return 1
	}
	return 0
}
