package tune

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"sort"
	"strconv"
	"sync"

	"github.com/kiln-ml/kiln/compiler/ir"
	"github.com/kiln-ml/kiln/compiler/script"
)

// Workload identifies a PrimFunc to tune: the structural hash of the
// function without its attributes (so its name does not count), its name
// and its text.
type Workload struct {
	Hash string `json:"hash"`
	Name string `json:"name,omitempty"`
	Text string `json:"text,omitempty"`
	// Shape and Generic are set for a function with symbolic sizes tuned
	// bound to a shape (see Bind): the binding, and the hash of the
	// function before binding.
	Shape   map[string]int64 `json:"shape,omitempty"`
	Generic string           `json:"generic,omitempty"`
}

// WorkloadOf returns f's workload.
func WorkloadOf(f *ir.PrimFunc) Workload {
	name, _ := f.Attrs[ir.AttrGlobalSymbol].(string)
	g := *f
	g.Attrs = nil
	return Workload{Hash: fmt.Sprintf("%016x", ir.StructuralHash(&g)), Name: name, Text: script.Print(f)}
}

// Record is one measured candidate: a line of the tuning database.
type Record struct {
	Workload Workload `json:"workload"`
	// Target is the target string the candidate was built for.
	Target string `json:"target"`
	// Device describes the board that measured it (arch, cpu, key…).
	Device map[string]string `json:"device,omitempty"`
	// Decisions replay the candidate; Trace is the schedule they give.
	// Schedule names the half of the space they are decisions of: none,
	// the schedule rules of compiler/tune/rules; "rules", the default
	// rules' choices; "default", the default schedule (the default rules
	// with their own picks, or no decisions in older records).
	Decisions []Decision `json:"decisions"`
	Schedule  string     `json:"schedule,omitempty"`
	Trace     []string   `json:"trace,omitempty"`
	// Times are the seconds per call of each repeat; empty when the
	// candidate failed.
	Times []float64 `json:"times,omitempty"`
	// Error says why the candidate failed and Stage where ("generate",
	// "build", "run", "check").
	Error string `json:"error,omitempty"`
	Stage string `json:"stage,omitempty"`
	// Unix is when it was measured (seconds).
	Unix int64 `json:"unix,omitempty"`
	// Pair, when set, is shared by the two records of a head-to-head:
	// the default schedule and the search's best, timed one after the
	// other at the end of a run, so that they are compared under the same
	// load (records timed minutes apart on a busy machine are not). The
	// latest head-to-head decides Best.
	Pair int64 `json:"pair,omitempty"`
	// LayoutPair, when set, is shared by the records of a layout
	// head-to-head: the best records of the kernels of a convolution
	// site's default kernel layout and of its cheapest other one, timed
	// again one after the other at the end of a run; the latest one
	// decides the site's layout (ChooseLayouts).
	LayoutPair int64 `json:"layout_pair,omitempty"`
	// Validity is the time evaluator's verdict on Times (records written
	// before it have none).
	Validity
}

// Validity is what the time evaluator said of a candidate's timing.
type Validity struct {
	// Verdict is "stable" (the median's 95% confidence interval within
	// the threshold) or "noisy"; Noise says why a timing is noisy.
	Verdict string `json:"verdict,omitempty"`
	Noise   string `json:"noise,omitempty"`
	// CV is the coefficient of variation of the times.
	CV float64 `json:"cv,omitempty"`
	// Remeasured is true when the first timing was noisy and the
	// candidate was timed once more before it was ranked: Times then
	// holds both timings' results and the verdict is theirs together.
	Remeasured bool `json:"remeasured,omitempty"`
	// Stopped is true when the timing stopped after its first repeat:
	// the candidate was already far slower than the best of its workload
	// (see Cutoff), so Times holds that repeat alone (or the time of the
	// call that checked its result, when that was already too slow).
	Stopped bool `json:"stopped,omitempty"`
}

// Valid reports whether the record measured a correct candidate.
func (r *Record) Valid() bool { return r.Error == "" && len(r.Times) > 0 }

// Median returns the median of the record's times (+Inf when invalid).
func (r *Record) Median() float64 {
	if !r.Valid() {
		return inf
	}
	t := slices.Clone(r.Times)
	sort.Float64s(t)
	if len(t)%2 == 1 {
		return t[len(t)/2]
	}
	return (t[len(t)/2-1] + t[len(t)/2]) / 2
}

// Database is a tuning database: the records of one target read from
// JSON-lines files (merged by concatenation), and a file new records are
// appended to, one line each, as they are measured.
type Database struct {
	target string
	mu     sync.Mutex
	recs   []Record
	byHash map[string][]int
	out    *os.File
	path   string
}

var inf = math.Inf(1)

// ErrBadLine marks the warnings of lines that do not parse.
var ErrBadLine = errors.New("line does not parse")

// NewDatabase returns an empty in-memory database for target.
func NewDatabase(target string) *Database {
	return &Database{target: target, byHash: map[string][]int{}}
}

// OpenDatabase reads the records of target from path (if the file
// exists) and opens it to append new ones. What it could not use comes
// back as notes: a line that does not parse is skipped with a note
// naming it, records of other targets are ignored with a note saying how
// many.
func OpenDatabase(path, target string) (*Database, []string, error) {
	db := NewDatabase(target)
	notes, err := db.Load(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, notes, err
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, notes, fmt.Errorf("tuning database: %w", err)
	}
	db.out, db.path = f, path
	return db, notes, nil
}

// Load adds the records of db's target from the JSON-lines file path.
func (db *Database) Load(path string) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("tuning database: %w", err)
	}
	defer f.Close()
	return db.Read(path, f)
}

// ErrNotDatabase is Read's error for a stream none of whose lines is a
// record and whose first line is not even a JSON object: another kind of
// file given as a tuning database.
var ErrNotDatabase = errors.New("not a tuning database")

// Read adds the records of db's target from r, a JSON-lines stream named
// name in notes. A line that does not parse is a note; a stream with no
// record at all whose first line is not a JSON object is ErrNotDatabase.
func (db *Database) Read(name string, r io.Reader) ([]string, error) {
	var notes []string
	other := map[string]int{}
	br := bufio.NewReader(r)
	records, first := 0, ""
	for n := 1; ; n++ {
		line, err := br.ReadBytes('\n')
		if t := bytes.TrimSpace(line); len(t) > 0 {
			if first == "" && t[0] != '{' {
				first = fmt.Sprintf("%s:%d", name, n)
			} else if first == "" {
				first = "-"
			}
			var rec Record
			if perr := decodeRecord(line, &rec); perr != nil {
				notes = append(notes, fmt.Sprintf("%s:%d: skipped: %v", name, n, perr))
			} else if records++; rec.Target != db.target {
				other[rec.Target]++
			} else {
				db.add(rec)
			}
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return notes, fmt.Errorf("tuning database %s: %w", name, err)
		}
	}
	if records == 0 && first != "" && first != "-" {
		return notes, fmt.Errorf("%s: %w: %s is not a JSON object (kiln tune writes one record a line)", name, ErrNotDatabase, first)
	}
	targets := make([]string, 0, len(other))
	for t := range other {
		targets = append(targets, t)
	}
	sort.Strings(targets)
	for _, t := range targets {
		notes = append(notes, fmt.Sprintf("%s: ignored %d records for target %q (tuning for %q)", name, other[t], t, db.target))
	}
	return notes, nil
}

// decodeRecord parses one line and checks the fields a record needs.
func decodeRecord(line []byte, r *Record) error {
	dec := json.NewDecoder(bytes.NewReader(line))
	if err := dec.Decode(r); err != nil {
		return fmt.Errorf("%w: %v", ErrBadLine, err)
	}
	if dec.More() {
		return fmt.Errorf("%w: more than one value on the line", ErrBadLine)
	}
	switch {
	case r.Workload.Hash == "":
		return fmt.Errorf("%w: no workload hash", ErrBadLine)
	case r.Target == "":
		return fmt.Errorf("%w: no target", ErrBadLine)
	case r.Schedule != "" && r.Schedule != DefaultSchedule && r.Schedule != RulesSchedule:
		return fmt.Errorf("%w: unknown schedule %q (want %q, %q or none)", ErrBadLine, r.Schedule, DefaultSchedule, RulesSchedule)
	}
	for _, t := range r.Times {
		if !(t > 0) || t > 1e6 {
			return fmt.Errorf("%w: time %s is not a positive number of seconds", ErrBadLine, strconv.FormatFloat(t, 'g', -1, 64))
		}
	}
	for _, d := range r.Decisions {
		if d.Site == "" {
			return fmt.Errorf("%w: a decision has no site", ErrBadLine)
		}
	}
	return nil
}

func (db *Database) add(r Record) {
	db.recs = append(db.recs, r)
	db.byHash[r.Workload.Hash] = append(db.byHash[r.Workload.Hash], len(db.recs)-1)
	if g := r.Workload.Generic; g != "" && g != r.Workload.Hash {
		db.byHash[genericKey(g)] = append(db.byHash[genericKey(g)], len(db.recs)-1)
	}
}

// genericKey indexes the records of bound workloads by the hash of the
// function before binding.
func genericKey(hash string) string { return "generic:" + hash }

// Target returns the database's target.
func (db *Database) Target() string { return db.target }

// Append adds r (of db's target) and writes it to the file, if any, as
// one line, before returning.
func (db *Database) Append(r Record) error {
	if r.Target != db.target {
		return fmt.Errorf("tuning database: record for target %q in a database for %q", r.Target, db.target)
	}
	db.mu.Lock()
	defer db.mu.Unlock()
	if db.out != nil {
		line, err := json.Marshal(r)
		if err != nil {
			return fmt.Errorf("tuning database: %w", err)
		}
		if _, err := db.out.Write(append(line, '\n')); err != nil {
			return fmt.Errorf("tuning database %s: %w", db.path, err)
		}
	}
	db.add(r)
	return nil
}

// Close closes the file records are appended to.
func (db *Database) Close() error {
	db.mu.Lock()
	defer db.mu.Unlock()
	if db.out == nil {
		return nil
	}
	err := db.out.Close()
	db.out = nil
	return err
}

// Records returns the records of a workload, in the order they came.
func (db *Database) Records(hash string) []Record {
	db.mu.Lock()
	defer db.mu.Unlock()
	var out []Record
	for _, i := range db.byHash[hash] {
		out = append(out, db.recs[i])
	}
	return out
}

// Best returns the valid record of a workload with the lowest median
// time; where the workload had a head-to-head (records of one Pair), the
// faster of the latest one's two instead.
func (db *Database) Best(hash string) (Record, bool) {
	var best Record
	found := false
	recs := db.Records(hash)
	for _, r := range recs {
		if r.Valid() && (!found || r.Median() < best.Median()) {
			best, found = r, true
		}
	}
	if w, ok := pairWinner(recs); ok {
		return w, true
	}
	return best, found
}

// pairWinner returns the faster record of the latest head-to-head whose
// two records are valid.
func pairWinner(recs []Record) (Record, bool) {
	byPair := map[int64][]Record{}
	var latest int64
	for _, r := range recs {
		if r.Pair != 0 && r.Valid() {
			byPair[r.Pair] = append(byPair[r.Pair], r)
		}
	}
	for id, rs := range byPair {
		if len(rs) == 2 && id > latest {
			latest = id
		}
	}
	if latest == 0 {
		return Record{}, false
	}
	a, b := byPair[latest][0], byPair[latest][1]
	if b.Median() < a.Median() {
		return b, true
	}
	return a, true
}

// Len returns how many records of db's target it holds.
func (db *Database) Len() int {
	db.mu.Lock()
	defer db.mu.Unlock()
	return len(db.recs)
}
