package cli

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/internal/exectest"
)

// runnableInfo is the info string of a fenced block that the README test
// runs: "```sh test".
const runnableInfo = "sh test"

// docBlock is one runnable shell block of a Markdown file.
type docBlock struct {
	file string
	line int // of the opening fence
	text string
}

// docBlocks returns the runnable blocks of a Markdown file, in order.
func docBlocks(path string) ([]docBlock, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []docBlock
	var cur *docBlock
	var body strings.Builder
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		trimmed := strings.TrimSpace(line)
		switch {
		case cur == nil && strings.HasPrefix(trimmed, "```") && strings.TrimSpace(strings.TrimPrefix(trimmed, "```")) == runnableInfo:
			cur = &docBlock{file: path, line: n}
			body.Reset()
		case cur != nil && trimmed == "```":
			cur.text = body.String()
			out = append(out, *cur)
			cur = nil
		case cur != nil:
			body.WriteString(line + "\n")
		}
	}
	if cur != nil {
		return nil, fmt.Errorf("%s:%d: runnable block not closed", path, cur.line)
	}
	return out, sc.Err()
}

// TestDocBlocks checks the extraction the README test relies on.
func TestDocBlocks(t *testing.T) {
	p := filepath.Join(t.TempDir(), "x.md")
	check.NoError(t, os.WriteFile(p, []byte("# x\n```sh\nnot run\n```\n```sh test\necho one\necho two\n```\ntext\n  ```sh test\nindented\n  ```\n"), 0o644))
	blocks, err := docBlocks(p)
	check.NoError(t, err)
	check.Equal(t, len(blocks), 2)
	check.Equal(t, blocks[0].line, 5)
	check.Equal(t, blocks[0].text, "echo one\necho two\n")
	check.Equal(t, blocks[1].text, "indented\n")
	check.NoError(t, os.WriteFile(p, []byte("```sh test\nopen\n"), 0o644))
	_, err = docBlocks(p)
	check.Error(t, err, "not closed")
}

// numpyPython returns a python3 that imports numpy ("" if none does).
func numpyPython() string {
	var cands []string
	if p, err := exec.LookPath("python3"); err == nil {
		cands = append(cands, p)
	}
	cands = append(cands, "/usr/bin/python3")
	for _, p := range cands {
		if exec.Command(p, "-c", "import numpy").Run() == nil {
			return p
		}
	}
	return ""
}

// TestREADME runs every block marked "```sh test" in README.md and
// docs/*.md, file by file, in order, each file in a fresh directory with
// this test binary standing in for the kiln binary on PATH and the
// loopback ports the blocks name replaced by free ones. A block that
// fails fails the test with its file, line and output. Processes a block
// leaves in the background (a fleet on loopback) are killed when its file
// is done.
func TestREADME(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the README's commands (-short)")
	}
	py := numpyPython()
	if py == "" {
		t.Skip("the README's examples make their inputs and check their outputs with numpy: no python3 with numpy here (Debian: python3-numpy)")
	}
	exe, err := os.Executable()
	check.NoError(t, err)
	bin := t.TempDir()
	wrapper := fmt.Sprintf("#!/bin/sh\n%s=1 exec %q \"$@\"\n", testMainEnv, exe)
	check.NoError(t, os.WriteFile(filepath.Join(bin, "kiln"), []byte(wrapper), 0o755))
	check.NoError(t, os.Symlink(py, filepath.Join(bin, "python3")))

	docs, err := filepath.Glob(filepath.Join("..", "docs", "*.md"))
	check.NoError(t, err)
	slices.Sort(docs)
	files := append([]string{filepath.Join("..", "README.md")}, docs...)
	total := 0
	for _, file := range files {
		blocks, err := docBlocks(file)
		check.NoError(t, err)
		if len(blocks) == 0 {
			continue
		}
		total += len(blocks)
		t.Run(filepath.Base(file), func(t *testing.T) { runDocBlocks(t, bin, blocks) })
	}
	check.True(t, total > 0, "no runnable blocks in README.md or docs/")
}

// loopbackRE matches the loopback addresses the documents' blocks use.
var loopbackRE = regexp.MustCompile(`127\.0\.0\.1:[0-9]+`)

// freeLoopbackPorts maps every loopback address the blocks name to a free
// port on 127.0.0.1, the same one wherever an address recurs, so that the
// blocks run beside anything already listening on the documents' ports.
func freeLoopbackPorts(t *testing.T, blocks []docBlock) map[string]string {
	ports := map[string]string{}
	for _, b := range blocks {
		for _, a := range loopbackRE.FindAllString(b.text, -1) {
			if _, ok := ports[a]; ok {
				continue
			}
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			check.NoError(t, err)
			ports[a] = ln.Addr().String()
			ln.Close()
		}
	}
	return ports
}

// docBlockLimit bounds one documentation block.
const docBlockLimit = 3 * time.Minute

// runDocBlocks runs one file's blocks in order in a fresh directory, with
// the loopback ports they name replaced by free ones.
func runDocBlocks(t *testing.T, bin string, blocks []docBlock) {
	dir := t.TempDir()
	ports := freeLoopbackPorts(t, blocks)
	if len(ports) > 0 {
		t.Logf("loopback addresses in this run: %v", ports)
	}
	var groups []int
	defer func() {
		// Stop what the blocks left running (their process groups),
		// politely first.
		for _, g := range groups {
			syscall.Kill(-g, syscall.SIGTERM)
		}
		for _, g := range groups {
			for i := 0; i < 100 && syscall.Kill(-g, 0) == nil; i++ {
				time.Sleep(50 * time.Millisecond)
			}
			syscall.Kill(-g, syscall.SIGKILL)
		}
	}()
	env := append(os.Environ(), "PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"),
		"GORACE="+strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	for i, b := range blocks {
		out, err := os.Create(filepath.Join(t.TempDir(), fmt.Sprintf("block%d.out", i)))
		check.NoError(t, err)
		text := loopbackRE.ReplaceAllStringFunc(b.text, func(a string) string { return ports[a] })
		cmd := exec.Command("bash", "-euo", "pipefail", "-c", text)
		cmd.Dir, cmd.Env = dir, env
		// Output goes to a file, not a pipe: a daemon started in the
		// background keeps its descriptors, and Wait must not wait for it.
		cmd.Stdout, cmd.Stderr = out, out
		err = exectest.Run(t, docBlockLimit, cmd)
		if cmd.Process != nil {
			// The block's process group: what it left running.
			groups = append(groups, cmd.Process.Pid)
		}
		out.Close()
		output, _ := os.ReadFile(out.Name())
		if err != nil {
			logs := ""
			for _, l := range []string{"tracker.log", "compiler.log", "device.log"} {
				if b, rerr := os.ReadFile(filepath.Join(dir, l)); rerr == nil {
					logs += fmt.Sprintf("\n--- %s:\n%s", l, b)
				}
			}
			t.Fatalf("%s:%d: block failed: %v\n--- block (as run):\n%s--- output:\n%s%s", b.file, b.line, err, text, output, logs)
		}
		t.Logf("%s:%d: ok\n%s", b.file, b.line, output)
	}
}
