package script

import (
	"fmt"
	"strings"
)

// Error is a syntax or semantic error in TVMScript text, at a line and
// column of a file. Its message shows the offending line with a caret
// under the column:
//
//	file.py:12:25: expected ':' after for header
//	    for i in T.grid(4, 4)
//	                         ^
type Error struct {
	File string
	// Line and Col are 1-based; Col counts runes.
	Line, Col int
	Msg       string
	// Source is the text of the line.
	Source string
}

// Error formats the position, the message, the line and the caret.
func (e *Error) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s:%d:%d: %s", e.File, e.Line, e.Col, e.Msg)
	if e.Source == "" {
		return b.String()
	}
	src := []rune(strings.ReplaceAll(e.Source, "\t", " "))
	trim := 0
	for trim < len(src) && src[trim] == ' ' {
		trim++
	}
	caret := e.Col - 1 - trim
	if caret < 0 {
		caret = 0
	}
	fmt.Fprintf(&b, "\n    %s\n    %s^", strings.TrimRight(string(src[trim:]), " \r"), strings.Repeat(" ", caret))
	return b.String()
}

func newError(file, src string, p pos, msg string) *Error {
	return &Error{File: file, Line: p.Line, Col: p.Col, Msg: msg, Source: sourceLine(src, p.Line)}
}

func sourceLine(src string, line int) string {
	for i := 1; i < line; i++ {
		j := strings.IndexByte(src, '\n')
		if j < 0 {
			return ""
		}
		src = src[j+1:]
	}
	if j := strings.IndexByte(src, '\n'); j >= 0 {
		src = src[:j]
	}
	return strings.TrimRight(src, "\r")
}
