package ui

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kiln-ml/kiln/client"
	"github.com/kiln-ml/kiln/rpcserver/proto"
	"github.com/kiln-ml/kiln/rpcserver/timer"
)

// page is what a template renders: the layout's fields and the page's
// own Data.
type page struct {
	Title string
	Nav   string // the active tab
	User  string
	CSRF  string
	// API is the JSON form of this page that the live script polls, and
	// Poll its period in milliseconds (0: not live).
	API  string
	Poll int64
	Now  time.Time
	Data any
}

// pageFunc reads one page's data through the session's tracker
// connection.
type pageFunc struct {
	nav, tmpl string
	live      bool
	fn        func(ctx context.Context, se *session, r *http.Request) (title string, data any, err error)
}

func (s *Server) routes() map[string]pageFunc {
	return map[string]pageFunc{
		"/fleet":        {"fleet", "fleet", true, s.fleet},
		"/jobs":         {"jobs", "jobs", true, s.jobs},
		"/jobs/{id}":    {"jobs", "job", true, s.job},
		"/tuning":       {"tuning", "tuning", true, s.tuning},
		"/results":      {"results", "results", true, s.results},
		"/results/{id}": {"results", "result", false, s.result},
		"/compare":      {"results", "compare", true, s.compare},
	}
}

// apiReply is a page's JSON form: its content, rendered as the page
// renders it, for the live script to put in place.
type apiReply struct {
	Title   string    `json:"title"`
	HTML    string    `json:"html"`
	Updated time.Time `json:"updated"`
}

// authed serves p to a logged-in visitor; others are sent to the login
// form (a page) or answered 401 (its JSON form).
func (s *Server) authed(p pageFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		api := strings.HasPrefix(r.URL.Path, "/api/")
		w.Header().Set("Cache-Control", "no-store")
		se := s.current(r)
		if se == nil {
			if api {
				writeJSON(w, http.StatusUnauthorized, map[string]string{"error": "log in first (POST /login with a token)"})
				return
			}
			http.Redirect(w, r, "/login?next="+url.QueryEscape(r.URL.RequestURI()), http.StatusSeeOther)
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), 20*time.Second)
		defer cancel()
		title, data, err := p.fn(ctx, se, r)
		pg := &page{Title: title, Nav: p.nav, User: displayUser(se.lc), CSRF: se.csrf, Now: time.Now(), Data: data}
		if p.live {
			pg.API = "/api" + r.URL.Path
			pg.Poll = s.cfg.Poll.Milliseconds()
		}
		status := http.StatusOK
		tmpl := p.tmpl
		if err != nil {
			if se.lc.Err() != nil {
				s.mu.Lock()
				s.endLocked(se)
				s.mu.Unlock()
				if api {
					writeJSON(w, http.StatusUnauthorized, map[string]string{"error": "the session's tracker connection ended; log in again"})
				} else {
					http.Redirect(w, r, "/login?next="+url.QueryEscape(r.URL.RequestURI()), http.StatusSeeOther)
				}
				return
			}
			status = statusOf(err)
			tmpl, pg.Title, pg.Data = "error", title, err.Error()
		}
		if !api {
			s.render(w, r, tmpl, pg, status)
			return
		}
		var buf bytes.Buffer
		if err := s.pages[tmpl].ExecuteTemplate(&buf, "content", pg); err != nil {
			s.log.Error("console template", "page", tmpl, "err", err)
			writeJSON(w, http.StatusInternalServerError, map[string]string{"error": "render " + tmpl + ": " + err.Error()})
			return
		}
		writeJSON(w, status, apiReply{Title: pg.Title, HTML: buf.String(), Updated: pg.Now})
	})
}

func statusOf(err error) int {
	switch {
	case errors.Is(err, proto.ErrNotFound):
		return http.StatusNotFound
	case errors.Is(err, proto.ErrBadRequest), errors.Is(err, errBadQuery):
		return http.StatusBadRequest
	case errors.Is(err, proto.ErrUnauthorized):
		return http.StatusForbidden
	}
	return http.StatusBadGateway
}

var errBadQuery = errors.New("bad query")

func (s *Server) render(w http.ResponseWriter, r *http.Request, name string, pg *page, status int) {
	var buf bytes.Buffer
	if err := s.pages[name].ExecuteTemplate(&buf, "layout", pg); err != nil {
		s.log.Error("console template", "page", name, "err", err)
		http.Error(w, "render "+name+": "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	w.Write(buf.Bytes())
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}

// call makes one tracker call on the session's connection.
func call[T any](ctx context.Context, se *session, method string, args any) (T, error) {
	var out T
	err := se.lc.Call(ctx, method, args, &out)
	return out, err
}

// fleetData is the fleet page.
type fleetData struct {
	Sum     proto.TrackerSummary
	Waiting int
}

func (s *Server) fleet(ctx context.Context, se *session, r *http.Request) (string, any, error) {
	sum, err := call[proto.TrackerSummary](ctx, se, proto.MethodTrackerQuery, proto.QueryArgs{Jobs: 1})
	if err != nil {
		return "Fleet", nil, fmt.Errorf("query the tracker: %w", err)
	}
	d := fleetData{Sum: sum}
	for _, q := range sum.Queues {
		d.Waiting += len(q.Waiting)
	}
	return "Fleet", d, nil
}

// jobsShown is how many recent jobs the jobs page lists.
const jobsShown = 100

type jobsData struct {
	Sum proto.TrackerSummary
}

func (s *Server) jobs(ctx context.Context, se *session, r *http.Request) (string, any, error) {
	sum, err := call[proto.TrackerSummary](ctx, se, proto.MethodTrackerQuery, proto.QueryArgs{Jobs: jobsShown})
	if err != nil {
		return "Build jobs", nil, fmt.Errorf("query the tracker: %w", err)
	}
	return "Build jobs", jobsData{Sum: sum}, nil
}

func (s *Server) job(ctx context.Context, se *session, r *http.Request) (string, any, error) {
	id := r.PathValue("id")
	j, err := call[proto.BuildJob](ctx, se, proto.MethodBuildStatus, proto.BuildJobArgs{ID: id})
	if err != nil {
		return "Job " + id, nil, fmt.Errorf("job %s: %w", id, err)
	}
	return "Job " + id, j, nil
}

// resultsShown bounds the results a page reads (the tracker's own limit
// on one list).
const resultsShown = 1000

type resultsData struct {
	Function, Device, Label string
	Results                 []proto.Result // newest first, at most tableRows
	Shown, Total            int
	Chart                   chart
	Functions, Devices      []string
}

const tableRows = 100

func (s *Server) results(ctx context.Context, se *session, r *http.Request) (string, any, error) {
	q := r.URL.Query()
	d := resultsData{Function: q.Get("function"), Device: q.Get("device"), Label: q.Get("label")}
	l, err := call[proto.ResultList](ctx, se, proto.MethodResultList, proto.ResultListArgs{
		Function: d.Function, DeviceKey: d.Device, Label: d.Label, Limit: resultsShown,
	})
	if err != nil {
		return "Results", nil, fmt.Errorf("list results: %w", err)
	}
	d.Total, d.Shown = l.Total, len(l.Results)
	d.Results = l.Results[:min(len(l.Results), tableRows)]
	d.Chart = historyChart(l.Results)
	fs, ds := map[string]bool{}, map[string]bool{}
	for _, r := range l.Results {
		fs[r.Function] = true
		ds[r.DeviceKey] = true
	}
	d.Functions, d.Devices = slices.Sorted(maps.Keys(fs)), slices.Sorted(maps.Keys(ds))
	return "Results", d, nil
}

type resultData struct {
	R       proto.Result
	Samples chart
	Kernels chart
}

func (s *Server) result(ctx context.Context, se *session, r *http.Request) (string, any, error) {
	id := r.PathValue("id")
	res, err := call[proto.Result](ctx, se, proto.MethodResultGet, proto.ResultGetArgs{ID: id})
	if err != nil {
		return "Result " + id, nil, fmt.Errorf("result %s: %w", id, err)
	}
	d := resultData{R: res, Samples: chart{Kind: "line", X: "repeat", Y: "seconds"}}
	if res.Source == proto.ResultSourceProfile {
		d.Samples.X = "inference" // a profile's repeats are inferences
	}
	pts := make([][2]float64, len(res.Time.Results))
	for i, v := range res.Time.Results {
		pts[i] = [2]float64{float64(i + 1), v}
	}
	d.Samples.Series = []series{{Name: res.Function, Points: pts}}
	if len(res.Kernels) > 0 {
		d.Kernels = chart{Kind: "bars", Y: "seconds"}
		for _, k := range res.Kernels {
			m := medianOf(k.Results)
			d.Kernels.Bars = append(d.Kernels.Bars, bar{Name: k.Name, Value: m, Low: minOf(k.Results), High: maxOf(k.Results)})
		}
	}
	return "Result " + id, d, nil
}

type compareData struct {
	A, B        string
	Threshold   float64
	Comparisons []client.ResultComparison
	OnlyOne     []string
	Chart       chart
	NA, NB      int
}

// defaultThreshold is the ratio beyond which a significant difference is
// called faster or slower, as kiln results compare's default.
const defaultThreshold = 0.02

func (s *Server) compare(ctx context.Context, se *session, r *http.Request) (string, any, error) {
	q := r.URL.Query()
	d := compareData{A: strings.TrimSpace(q.Get("a")), B: strings.TrimSpace(q.Get("b")), Threshold: defaultThreshold}
	if t := q.Get("threshold"); t != "" {
		v, err := strconv.ParseFloat(strings.TrimSuffix(t, "%"), 64)
		if strings.HasSuffix(t, "%") {
			v /= 100
		}
		if err != nil || v < 0 || v >= 1 {
			return "Compare", nil, fmt.Errorf("threshold %q: want a fraction in [0, 1) such as 0.05, or a percentage such as 5%%: %w", t, errBadQuery)
		}
		d.Threshold = v
	}
	if d.A == "" || d.B == "" {
		return "Compare", d, nil
	}
	setA, err := resultSet(ctx, se, d.A)
	if err != nil {
		return "Compare", nil, fmt.Errorf("A: %w", err)
	}
	setB, err := resultSet(ctx, se, d.B)
	if err != nil {
		return "Compare", nil, fmt.Errorf("B: %w", err)
	}
	d.NA, d.NB = len(setA), len(setB)
	d.Comparisons, d.OnlyOne = client.CompareResults(setA, setB, d.Threshold)
	d.Chart = chart{Kind: "bars", Y: "B / A", Ref: 1}
	for _, c := range d.Comparisons {
		d.Chart.Bars = append(d.Chart.Bars, bar{Name: c.Name(), Value: c.Ratio, Low: c.RatioLow, High: c.RatioHigh, Class: verdictClass(c.Verdict)})
	}
	return "Compare " + d.A + " and " + d.B, d, nil
}

// resultSet is what a comparison side names: one result by id, or every
// result that carries a label.
func resultSet(ctx context.Context, se *session, name string) ([]proto.Result, error) {
	r, err := call[proto.Result](ctx, se, proto.MethodResultGet, proto.ResultGetArgs{ID: name})
	if err == nil {
		return []proto.Result{r}, nil
	}
	if !errors.Is(err, proto.ErrNotFound) {
		return nil, err
	}
	l, err := call[proto.ResultList](ctx, se, proto.MethodResultList, proto.ResultListArgs{Label: name, Limit: resultsShown})
	if err != nil {
		return nil, err
	}
	if len(l.Results) == 0 {
		return nil, fmt.Errorf("%q is neither a result id nor a label of results you may see: %w", name, proto.ErrNotFound)
	}
	return l.Results, nil
}

func verdictClass(v string) string {
	switch v {
	case timer.Slower:
		return "slower"
	case timer.Faster:
		return "faster"
	}
	return "same"
}

// tuningRun is one tuning run (the results kiln tune --record recorded
// under one label) and its tasks.
type tuningRun struct {
	Label    string
	Device   string
	Trials   int
	PerMin   float64
	First    time.Time
	Last     time.Time
	Tasks    []tuningTask
	Chart    chart
	Recorded string // the newest trial's time
}

type tuningTask struct {
	Function string
	Trials   int
	Best     float64
}

type tuningData struct {
	Runs  []tuningRun
	Total int
}

func (s *Server) tuning(ctx context.Context, se *session, r *http.Request) (string, any, error) {
	l, err := call[proto.ResultList](ctx, se, proto.MethodResultList, proto.ResultListArgs{Source: proto.ResultSourceTune, Label: r.URL.Query().Get("label"), Limit: resultsShown})
	if err != nil {
		return "Tuning", nil, fmt.Errorf("list tuning results: %w", err)
	}
	return "Tuning", tuningData{Runs: tuningRuns(l.Results), Total: l.Total}, nil
}

// tuningRuns groups tuning trials by label and, within a run, by task,
// oldest first; each task's curve is its best time so far against its
// trials.
func tuningRuns(rs []proto.Result) []tuningRun {
	byLabel := map[string][]proto.Result{}
	for _, r := range rs {
		byLabel[r.Label] = append(byLabel[r.Label], r)
	}
	var runs []tuningRun
	for label, trials := range byLabel {
		slices.SortFunc(trials, func(a, b proto.Result) int { return a.Recorded.Compare(b.Recorded) })
		run := tuningRun{Label: label, Trials: len(trials), First: trials[0].Recorded, Last: trials[len(trials)-1].Recorded, Device: trials[0].DeviceKey}
		if span := run.Last.Sub(run.First).Minutes(); span > 0 && len(trials) > 1 {
			run.PerMin = float64(len(trials)-1) / span
		}
		tasks := map[string]*tuningTask{}
		curves := map[string][][2]float64{}
		for _, t := range trials {
			m := t.Time.Median
			if m <= 0 {
				m = medianOf(t.Time.Results)
			}
			tk := tasks[t.Function]
			if tk == nil {
				tk = &tuningTask{Function: t.Function, Best: m}
				tasks[t.Function] = tk
			}
			tk.Trials++
			tk.Best = min(tk.Best, m)
			curves[t.Function] = append(curves[t.Function], [2]float64{float64(tk.Trials), tk.Best})
		}
		run.Chart = chart{Kind: "line", X: "trial", Y: "best seconds so far", Step: true}
		for _, name := range slices.Sorted(maps.Keys(tasks)) {
			run.Tasks = append(run.Tasks, *tasks[name])
			run.Chart.Series = append(run.Chart.Series, series{Name: name, Points: curves[name]})
		}
		runs = append(runs, run)
	}
	slices.SortFunc(runs, func(a, b tuningRun) int { return b.Last.Compare(a.Last) })
	return runs
}

// historyChart plots each function's median on each device key against
// the time it was recorded.
func historyChart(rs []proto.Result) chart {
	c := chart{Kind: "line", X: "time", Y: "median seconds"}
	by := map[string][][2]float64{}
	for i := len(rs) - 1; i >= 0; i-- { // oldest first
		r := rs[i]
		m := r.Time.Median
		if m <= 0 {
			m = medianOf(r.Time.Results)
		}
		name := r.Function + " @ " + dashed(r.DeviceKey)
		by[name] = append(by[name], [2]float64{float64(r.Recorded.UnixMilli()), m})
	}
	for _, name := range slices.Sorted(maps.Keys(by)) {
		c.Series = append(c.Series, series{Name: name, Points: by[name]})
	}
	return c
}

func dashed(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func medianOf(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Sorted(slices.Values(xs))
	if n := len(s); n%2 == 0 {
		return (s[n/2-1] + s[n/2]) / 2
	}
	return s[len(s)/2]
}

func minOf(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	return slices.Min(xs)
}

func maxOf(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	return slices.Max(xs)
}

// chart is what static/chart.js draws, carried in a data-chart attribute:
// a line chart of series of points, or a bar chart (a value per name,
// with its range as a whisker).
type chart struct {
	Kind string `json:"kind"`
	// X is the x axis: "time" (Unix milliseconds) or a name for numbers.
	X string `json:"x,omitempty"`
	Y string `json:"y,omitempty"`
	// Step draws each series as a staircase (best so far).
	Step   bool     `json:"step,omitempty"`
	Series []series `json:"series,omitempty"`
	Bars   []bar    `json:"bars,omitempty"`
	// Ref draws a reference line at this value on a bar chart (1 for a
	// ratio); 0 draws none.
	Ref float64 `json:"ref,omitempty"`
}

type series struct {
	Name   string       `json:"name"`
	Points [][2]float64 `json:"points"`
}

type bar struct {
	Name      string    `json:"name"`
	Value     float64   `json:"value"`
	Low, High float64   `json:"-"`
	Range     []float64 `json:"range,omitempty"`
	Class     string    `json:"class,omitempty"`
}

// JSON is the chart as the data-chart attribute carries it.
func (c chart) JSON() string {
	for i := range c.Bars {
		b := &c.Bars[i]
		if finite(b.Low) && finite(b.High) && b.High > b.Low {
			b.Range = []float64{b.Low, b.High}
		}
		if !finite(b.Value) {
			b.Value = 0
		}
	}
	out, err := json.Marshal(c)
	if err != nil {
		return `{"kind":"none"}`
	}
	return string(out)
}

func finite(f float64) bool { return f == f && f < 1e308 && f > -1e308 }

// funcs are the templates' helpers.
var funcs = template.FuncMap{
	"ago": func(now, t time.Time) string {
		if t.IsZero() {
			return "-"
		}
		return roundDur(now.Sub(t)) + " ago"
	},
	"took": func(now, from, to time.Time) string {
		if from.IsZero() {
			return "-"
		}
		if to.IsZero() {
			to = now
		}
		return roundDur(to.Sub(from))
	},
	"dur":     roundDur,
	"secs":    fmtSecs,
	"attrs":   attrList,
	"ratio":   func(r float64) string { return strconv.FormatFloat(r, 'f', 3, 64) },
	"pct":     func(f float64) string { return strconv.FormatFloat(100*f, 'f', 1, 64) + "%" },
	"short":   func(s string, n int) string { return s[:min(len(s), n)] },
	"rfc3339": func(t time.Time) string { return t.UTC().Format(time.RFC3339) },
	"verdict": verdictClass,
	"join":    strings.Join,
}

func roundDur(d time.Duration) string {
	switch {
	case d < 0:
		d = 0
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	}
	return d.Round(time.Second).String()
}

// fmtSecs writes seconds with a unit fit to their size.
func fmtSecs(v float64) string {
	switch a := max(v, -v); {
	case v == 0:
		return "0"
	case a < 1e-6:
		return strconv.FormatFloat(v*1e9, 'f', 1, 64) + " ns"
	case a < 1e-3:
		return strconv.FormatFloat(v*1e6, 'f', 2, 64) + " µs"
	case a < 1:
		return strconv.FormatFloat(v*1e3, 'f', 3, 64) + " ms"
	}
	return strconv.FormatFloat(v, 'f', 3, 64) + " s"
}

// attrList is a device's attributes as selector terms, sorted, leaving
// out the long CPU flag list (cpu.avx512 stays).
func attrList(a proto.NodeAttrs) []string {
	flat := a.Flatten()
	var out []string
	for _, k := range slices.Sorted(maps.Keys(flat)) {
		if strings.HasPrefix(k, "cpu.") && flat[k] == "true" && k != "cpu.avx512" && k != "cpu.avx2" && k != "cpu.neon" {
			continue
		}
		if k == "memory" || k == "cores" {
			continue
		}
		out = append(out, k+"="+flat[k])
	}
	return out
}
