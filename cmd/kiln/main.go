// Command kiln is kiln's one binary: tracker, compiler node, device daemon
// and client. It only runs the CLI app of package cli.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/kiln-ml/kiln/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := cli.Run(ctx, cli.App(), os.Args)
	stop()
	if err != nil {
		fmt.Fprintf(os.Stderr, "kiln: %v\n", err)
		os.Exit(1)
	}
}
