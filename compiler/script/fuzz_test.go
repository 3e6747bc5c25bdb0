package script

import (
	"math/rand"
	"os"
	"path/filepath"
	"testing"

	"github.com/kiln-ml/kiln/compiler/ir"
)

// corpus returns the texts of the seed and feature files.
func corpus(tb testing.TB) []string {
	files, _ := filepath.Glob("testdata/*.py")
	extra, _ := filepath.Glob("testdata/extra/*.py")
	var out []string
	for _, path := range append(files, extra...) {
		src, err := os.ReadFile(path)
		if err != nil {
			tb.Fatal(err)
		}
		out = append(out, string(src))
	}
	return out
}

// roundTrip checks the parser's property on src: it must not panic, its
// errors are *Error, and what it accepts prints, parses back, prints the
// same and is structurally equal.
func roundTrip(t *testing.T, src string) {
	t.Helper()
	m, err := Parse("fuzz.py", src)
	if err != nil {
		if _, ok := err.(*Error); !ok {
			t.Fatalf("error of type %T: %v", err, err)
		}
		return
	}
	p1 := Print(m)
	m2, err := Parse("printed.py", p1)
	if err != nil {
		t.Fatalf("printed text does not parse: %v\n--- input:\n%s\n--- printed:\n%s", err, src, p1)
	}
	if p2 := Print(m2); p2 != p1 {
		t.Fatalf("print is unstable:\n--- input:\n%s\n--- first:\n%s\n--- second:\n%s", src, p1, p2)
	}
	if !ir.StructuralEqual(m, m2) {
		t.Fatalf("parse(print(m)) differs from m:\n%s", p1)
	}
}

// FuzzParse feeds arbitrary text to Parse (see roundTrip). Its corpus is
// the seeds and testdata/fuzz/FuzzParse, which keeps inputs that once
// broke the property.
//
//	go test -fuzz=FuzzParse -fuzztime=60s ./compiler/script
func FuzzParse(f *testing.F) {
	for _, src := range corpus(f) {
		f.Add(src)
	}
	f.Fuzz(roundTrip)
}

// TestMutations runs the FuzzParse property on a fixed number of random
// byte-level mutations of the corpus (deleting, replacing and duplicating
// a few bytes), with a fixed seed so that failures reproduce.
func TestMutations(t *testing.T) {
	seeds := corpus(t)
	r := rand.New(rand.NewSource(1))
	n := 400
	if testing.Short() {
		n = 50
	}
	for i := 0; i < n; i++ {
		s := []byte(seeds[r.Intn(len(seeds))])
		for k := r.Intn(4) + 1; k > 0; k-- {
			j := r.Intn(len(s))
			switch r.Intn(3) {
			case 0:
				s = append(s[:j], s[j+1:]...)
			case 1:
				s[j] = byte(r.Intn(128))
			case 2:
				c := s[r.Intn(len(s))]
				s = append(s[:j], append([]byte{c}, s[j:]...)...)
			}
		}
		roundTrip(t, string(s))
	}
}
