package script

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/kiln-ml/kiln/compiler/ir"
)

// FuzzParse feeds arbitrary text to Parse: it must not panic, and what it
// accepts must print, parse back and print the same.
//
//	go test -fuzz=FuzzParse -fuzztime=60s ./compiler/script
func FuzzParse(f *testing.F) {
	files, _ := filepath.Glob("testdata/*.py")
	extra, _ := filepath.Glob("testdata/extra/*.py")
	for _, path := range append(files, extra...) {
		src, err := os.ReadFile(path)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(string(src))
	}
	f.Fuzz(func(t *testing.T, src string) {
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
			t.Fatalf("printed text does not parse: %v\n%s", err, p1)
		}
		if p2 := Print(m2); p2 != p1 {
			t.Fatalf("print is unstable:\n%s\n---\n%s", p1, p2)
		}
		if !ir.StructuralEqual(m, m2) {
			t.Fatalf("parse(print(m)) differs from m:\n%s", p1)
		}
	})
}
