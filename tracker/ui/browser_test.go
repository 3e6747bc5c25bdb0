package ui_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/rpcserver/proto"
)

// chromium finds a Chromium or Chrome to drive (KILN_CHROMIUM names one).
func chromium() string {
	if p := os.Getenv("KILN_CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	return ""
}

// TestConsoleInBrowser drives the console in a headless Chromium against
// a real tracker and device daemon: login is required, each page shows
// what the fleet holds (the device's name, a build job whose state
// changes while the page is open, charts with drawn points), user A
// never sees user B's private results, and the pages fit a phone's
// width. It saves a screenshot of each page at desktop and at phone
// width (390 px) in the test's artifact directory (go test -artifacts
// keeps them).
func TestConsoleInBrowser(t *testing.T) {
	exe := chromium()
	if exe == "" {
		t.Skip("no chromium on PATH (apt-get install chromium; or set KILN_CHROMIUM): the console's browser test needs one")
	}
	f := startFleet(t, 300*time.Millisecond)
	bg := context.Background()
	// Alice's history of one kernel (two labels, for a comparison), a
	// tuning run, and bob's private result.
	for i := range 4 {
		base := 1e-3 * (1 + 0.05*float64(i))
		record(t, f.aliceTracker, "matmul", "base", false, base, base*1.01, base*1.02, base*1.03, base*1.04, base*1.05)
		record(t, f.aliceTracker, "matmul", "pr-42", false, 2*base, 2*base*1.01, 2*base*1.02, 2*base*1.03, 2*base*1.04, 2*base*1.05)
	}
	for i := range 5 {
		v := 2e-3 / float64(i+1)
		_, err := f.aliceTracker.RecordResult(bg, proto.Result{
			Function: "dense_relu", Label: "tune-nightly", Source: proto.ResultSourceTune, DeviceKey: "cpu",
			Time: proto.TimeResult{Results: []float64{v, v, v}, Median: v},
		})
		check.NoError(t, err)
	}
	bobSecret := record(t, f.bobTracker, "bob_secret_fn", "bob-only", false, 5e-3, 5e-3, 5e-3)
	job, err := f.aliceTracker.SubmitBuild(bg, proto.BuildSubmitArgs{Name: "console-test", Module: "# module\n", Target: "cpu"})
	check.NoError(t, err)

	shots := t.ArtifactDir()
	t.Logf("screenshots in %s", shots)
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(exe), chromedp.NoSandbox, chromedp.DisableGPU, chromedp.WindowSize(1280, 900),
		chromedp.Flag("disable-dev-shm-usage", true))
	actx, acancel := chromedp.NewExecAllocator(bg, opts...)
	defer acancel()
	ctx, cancel := chromedp.NewContext(actx)
	defer cancel()
	ctx, tcancel := context.WithTimeout(ctx, 3*time.Minute)
	defer tcancel()

	type step = chromedp.Action[chromedp.Void]
	css := func(sel string) chromedp.CSS { return chromedp.CSS(sel) }
	run := func(what string, steps ...step) {
		t.Helper()
		if err := chromedp.Do(ctx, steps...); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	value := func(what string, v any, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	shot := func(name string) {
		t.Helper()
		png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
		value("screenshot "+name, png, err)
		check.NoError(t, os.WriteFile(filepath.Join(shots, name+".png"), png, 0o644))
	}
	text := func(sel string) string {
		t.Helper()
		s, err := chromedp.Run(ctx, chromedp.Text(css(sel)))
		value("read "+sel, s, err)
		return s
	}
	count := func(sel string) int {
		t.Helper()
		n, err := chromedp.Run(ctx, chromedp.Evaluate[int](fmt.Sprintf("document.querySelectorAll(%q).length", sel)))
		value("count "+sel, n, err)
		return n
	}
	location := func() string {
		t.Helper()
		l, err := chromedp.Run(ctx, chromedp.Location())
		value("location", l, err)
		return l
	}

	// Login is required: a page sends the visitor to the form.
	run("open the fleet page", chromedp.Navigate(f.url+"/fleet"), chromedp.WaitVisible(css("#token")))
	loc := location()
	check.True(t, strings.Contains(loc, "/login?next="), loc)
	run("log in with a wrong token", chromedp.SendKeys(css("#token"), "kiln-user-wrong"), chromedp.Click(css("#login")),
		chromedp.WaitVisible(css("#login-error")))
	shot("login-refused")
	run("log in as alice", chromedp.SendKeys(css("#token"), f.alice), chromedp.Click(css("#login")),
		chromedp.WaitVisible(css("#devices")))
	loc = location()
	check.True(t, strings.HasSuffix(loc, "/fleet"), loc)
	check.True(t, strings.Contains(text("#devices"), "board-7"), "the fleet page names the device")
	check.Equal(t, strings.TrimSpace(text("#user")), "alice")
	shot("fleet")

	// A job's state changes on its page while the page stays open.
	run("open the job", chromedp.Navigate(f.url+"/jobs/"+job.ID), chromedp.WaitVisible(css("#job-state")))
	check.Equal(t, text("#job-state"), "queued")
	shot("job-queued")
	_, err = f.aliceTracker.CancelBuild(bg, job.ID)
	check.NoError(t, err)
	run("see the job cancelled without a reload", chromedp.WaitVisible(css(`#job[data-state="cancelled"]`)))
	check.Equal(t, text("#job-state"), "cancelled")
	shot("job-cancelled")
	run("open the jobs list", chromedp.Navigate(f.url+"/jobs"), chromedp.WaitVisible(css("#jobs")))
	check.True(t, strings.Contains(text("#jobs"), job.ID), "the jobs page lists the job")
	shot("jobs")

	// Results: a history chart with a point per result; nothing of bob's.
	run("open the results", chromedp.Navigate(f.url+"/results"), chromedp.WaitVisible(css("#history svg circle.pt")))
	check.Equal(t, count("#history svg circle.pt"), 13) // 8 of matmul, 5 of dense_relu
	body := text("body")
	check.True(t, !strings.Contains(body, "bob_secret_fn"), "alice must not see bob's private result")
	shot("results")
	run("open bob's result by id", chromedp.Navigate(f.url+"/results/"+bobSecret.ID), chromedp.WaitVisible(css("#error")))
	check.True(t, !strings.Contains(text("body"), "bob_secret_fn"), "bob's result by id is not shown to alice")
	run("compare two labels", chromedp.Navigate(f.url+"/compare?a=base&b=pr-42"), chromedp.WaitVisible(css("#comparison svg rect.bar")))
	check.Equal(t, count("#comparison svg rect.bar.slower"), 3) // matmul and its two kernels
	shot("compare")
	run("open the tuning runs", chromedp.Navigate(f.url+"/tuning"), chromedp.WaitVisible(css(`section.run[data-label="tune-nightly"] svg circle.pt`)))
	check.Equal(t, count("section.run svg circle.pt"), 5)
	shot("tuning")

	// At a phone's width every page fits: nothing wider than the screen
	// (tables scroll inside their own box).
	run("phone width", chromedp.EmulateViewport(390, 844, chromedp.EmulateScale(2), chromedp.EmulateMobile))
	for _, p := range []string{"fleet", "jobs", "jobs/" + job.ID, "results", "compare?a=base&b=pr-42", "tuning"} {
		run("open "+p+" at phone width", chromedp.Navigate(f.url+"/"+p), chromedp.WaitVisible(css("#content")))
		width, err := chromedp.Run(ctx, chromedp.Evaluate[int]("document.documentElement.scrollWidth"))
		value("measure "+p, width, err)
		check.True(t, width <= 390, p, "is", width, "px wide at a 390 px screen")
		shot("phone-" + strings.NewReplacer("/", "-", "?", "-", "&", "-", "=", "-").Replace(p))
	}
	run("desktop width", chromedp.EmulateReset())

	// Log out (the page's form), then bob sees his result and not alice's.
	run("log out", chromedp.Navigate(f.url+"/fleet"), chromedp.WaitVisible(css("#devices")),
		chromedp.Click(css(".who button")), chromedp.WaitVisible(css("#token")))
	run("log in as bob", chromedp.SendKeys(css("#token"), f.bob), chromedp.Click(css("#login")),
		chromedp.WaitVisible(css("#devices")),
		chromedp.Navigate(f.url+"/results"), chromedp.WaitVisible(css("#results")))
	body = text("#results")
	check.True(t, strings.Contains(body, "bob_secret_fn"), "bob sees his own result")
	check.True(t, !strings.Contains(body, "matmul"), "bob must not see alice's private results")
	shot("results-bob")
}
