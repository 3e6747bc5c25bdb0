package cli

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"text/tabwriter"

	ucli "github.com/urfave/cli/v2"

	"github.com/kiln-ml/kiln/abi"
)

// version is kiln's release version, set at link time:
//
//	go build -ldflags "-X github.com/kiln-ml/kiln/cli.version=v0.1.0" ./cmd/kiln
//
// When empty, Version reports devVersion plus the VCS revision.
var version = ""

// devVersion is the version of a build that was not stamped with -ldflags.
const devVersion = "0.0.0-dev"

// Version returns kiln's version: the -ldflags stamp, or devVersion with the
// VCS revision ("0.0.0-dev+3f2a9c1d0b7e-dirty") when the build recorded one.
func Version() string {
	if version != "" {
		return version
	}
	return devVersion + vcsSuffix()
}

func vcsSuffix() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return ""
	}
	var rev string
	var dirty bool
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if rev == "" {
		return ""
	}
	if len(rev) > 12 {
		rev = rev[:12]
	}
	if dirty {
		rev += "-dirty"
	}
	return "+" + rev
}

func versionCommand() *ucli.Command {
	return &ucli.Command{
		Name:      "version",
		Usage:     "print kiln's version, the Go toolchain, the platform and the kernel ABI version",
		UsageText: "kiln version",
		Description: `Prints the version of this kiln binary (set at link time with
-ldflags "-X github.com/kiln-ml/kiln/cli.version=…", otherwise a dev version with
the VCS revision), the Go version it was built with, GOOS/GOARCH, and the
version of the kernel ABI it loads modules of.

Example:
   $ kiln version
   kiln     0.0.0-dev
   go       go1.26.0
   platform linux/amd64
   abi      1`,
		Action: runVersion,
	}
}

func runVersion(c *ucli.Context) error {
	if err := noArgs(c); err != nil {
		return err
	}
	tw := tabwriter.NewWriter(c.App.Writer, 0, 0, 1, ' ', 0)
	fmt.Fprintf(tw, "kiln\t%s\n", Version())
	fmt.Fprintf(tw, "go\t%s\n", runtime.Version())
	fmt.Fprintf(tw, "platform\t%s/%s\n", runtime.GOOS, runtime.GOARCH)
	fmt.Fprintf(tw, "abi\t%d\n", abi.Version)
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write version: %w", err)
	}
	return nil
}
