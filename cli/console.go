package cli

import (
	"context"
	"fmt"
	"net"

	ucli "github.com/urfave/cli/v2"

	"github.com/kiln-ml/kiln/rpcserver/proto"
	"github.com/kiln-ml/kiln/tracker"
	"github.com/kiln-ml/kiln/tracker/ui"
)

func consoleFlag() ucli.Flag {
	return &ucli.StringFlag{Name: "ui-listen", Usage: "HTTP address of the web console (off by default): the fleet, build jobs, tuning runs and results, behind the tracker's tokens and over its TLS (see docs/operating.md)"}
}

// checkConsole refuses a console bound beyond loopback on a tracker that
// checks no token (as the tracker's own listener is refused), unless
// --insecure.
func checkConsole(c *ucli.Context, cfg tracker.Config) error {
	addr := c.String("ui-listen")
	if addr == "" || cfg.Insecure {
		return nil
	}
	if err := proto.CheckExposure("the console", addr, cfg.Token+cfg.UsersFile, cfg.TLS, "--insecure"); err != nil {
		return fmt.Errorf("--ui-listen: %w", err)
	}
	return nil
}

// startConsole serves the web console on --ui-listen, when given, until
// ctx ends; the returned wait returns once it has stopped.
func startConsole(ctx context.Context, c *ucli.Context, srv *tracker.Server, cfg tracker.Config) (wait func() error, err error) {
	addr := c.String("ui-listen")
	if addr == "" {
		return func() error { return nil }, nil
	}
	if cfg.TLS == nil && !proto.Loopback(addr) {
		cfg.Logger.Warn("the console serves plain HTTP beyond loopback: tokens and session cookies cross the network in clear; give the tracker --tls-cert and --tls-key", "ui", addr)
	}
	con, err := ui.New(ui.Config{Tracker: srv, TLS: cfg.TLS, Logger: cfg.Logger.With("part", "console")})
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("console listen %s: %w", addr, err)
	}
	scheme := "http"
	if cfg.TLS != nil {
		scheme = "https"
	}
	fmt.Fprintf(c.App.ErrWriter, "kiln console on %s://%s\n", scheme, ln.Addr())
	done := make(chan error, 1)
	go func() { done <- con.Serve(ctx, ln) }()
	return func() error { return <-done }, nil
}
