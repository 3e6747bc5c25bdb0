package cli

import (
	"fmt"
	"io"
	"os"
	"time"

	"github.com/schollz/progressbar/v3"
	ucli "github.com/urfave/cli/v2"
	"golang.org/x/term"

	"github.com/kiln-ml/kiln/compiler"
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

// stages reports the phases of long work on the error writer: a line
// "PREFIX: PHASE (1.2 s)" as each one ends, whether or not the writer is
// a terminal (a log or a pipe gets the lines too), and on a terminal the
// spinner names the phase under way. Under --json it is silent. A nil
// *stages is valid and silent.
type stages struct {
	w      io.Writer
	prefix string
	spin   *progress
	begun  time.Time
}

// startStages starts reporting the phases of what (the spinner's first
// text), each line starting with prefix.
func startStages(c *ucli.Context, prefix, what string) *stages {
	for _, l := range c.Lineage() {
		if l.Command != nil && l.IsSet("json") && l.Bool("json") {
			return nil
		}
	}
	return &stages{w: c.App.ErrWriter, prefix: prefix, spin: startProgress(c, what), begun: time.Now()}
}

// start names the phase that begins and returns the func that reports
// its end.
func (s *stages) start(name string) func() {
	if s == nil {
		return func() {}
	}
	s.spin.describe(s.prefix + ": " + name)
	begun := time.Now()
	return func() { s.line(fmt.Sprintf("%s (%s)", name, fmtElapsed(time.Since(begun)))) }
}

// stage is start and its end for a compiler.BuildOptions.Progress.
func (s *stages) stage(st compiler.Stage) {
	if s == nil {
		return
	}
	if !st.Done {
		s.spin.describe(s.prefix + ": " + st.Name)
		return
	}
	s.line(fmt.Sprintf("%s (%s)", st.Name, fmtElapsed(st.Took)))
}

// event reports a moment of the work with the time since it began:
// "PREFIX: TEXT (3.4 s)".
func (s *stages) event(text string) {
	if s == nil {
		return
	}
	s.spin.describe(s.prefix + ": " + text)
	s.line(fmt.Sprintf("%s (%s)", text, fmtElapsed(time.Since(s.begun))))
}

// line prints one line above the spinner.
func (s *stages) line(text string) {
	if s.spin != nil {
		_ = s.spin.bar.Clear()
	}
	fmt.Fprintf(s.w, "%s: %s\n", s.prefix, text)
}

// done clears the spinner.
func (s *stages) done() {
	if s != nil {
		s.spin.done()
	}
}

// fmtElapsed is an elapsed time as "12.3 s" ("0.04 s" below a second).
func fmtElapsed(d time.Duration) string {
	if d < time.Second {
		return fmt.Sprintf("%.2f s", d.Seconds())
	}
	return fmt.Sprintf("%.1f s", d.Seconds())
}
