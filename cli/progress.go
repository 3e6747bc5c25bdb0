package cli

import (
	"io"
	"os"
	"time"

	"github.com/schollz/progressbar/v3"
	ucli "github.com/urfave/cli/v2"
	"golang.org/x/term"
)

// progress shows that long work is under way: a spinner with the step's
// name and the elapsed time, redrawn in place on a terminal. It shows
// nothing when the error stream is not a terminal or the command prints
// --json, so logs and pipes stay clean. A nil *progress is valid and
// silent.
type progress struct {
	bar *progressbar.ProgressBar
}

// startProgress starts a spinner describing what is being done, or returns
// nil when progress should not be shown.
func startProgress(c *ucli.Context, what string) *progress {
	if !showProgress(c) {
		return nil
	}
	bar := progressbar.NewOptions(-1,
		progressbar.OptionSetWriter(c.App.ErrWriter),
		progressbar.OptionSetDescription(what),
		progressbar.OptionSpinnerType(14),
		progressbar.OptionSetElapsedTime(true),
		progressbar.OptionClearOnFinish(),
		progressbar.OptionThrottle(100*time.Millisecond),
		progressbar.OptionSetRenderBlankState(true),
	)
	return &progress{bar: bar}
}

// describe changes the spinner's text.
func (p *progress) describe(what string) {
	if p != nil {
		p.bar.Describe(what)
	}
}

// done clears the spinner; the caller prints the step's result.
func (p *progress) done() {
	if p != nil {
		p.bar.Finish()
		p.bar.Exit()
	}
}

// showProgress says whether progress goes to the user: the error writer
// is a terminal and the command was not asked for --json.
func showProgress(c *ucli.Context) bool {
	for _, l := range c.Lineage() {
		if l.Command != nil && l.IsSet("json") && l.Bool("json") {
			return false
		}
	}
	return isTerminal(c.App.ErrWriter)
}

// isTerminal reports whether w is a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}
