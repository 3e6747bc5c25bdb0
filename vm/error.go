package vm

import (
	"fmt"
	"strconv"
	"strings"
)

// maxTrace is the number of frames an Error keeps.
const maxTrace = 8

// Frame is one function activation in an Error's trace.
type Frame struct {
	Func string // function name
	PC   int    // instruction index
	Call string // the callee of a call instruction ("" for others)
}

func (f Frame) String() string {
	s := f.Func + ": instruction " + strconv.Itoa(f.PC)
	if f.Call != "" {
		s += " (call " + strconv.Quote(f.Call) + ")"
	}
	return s
}

// Error is a failure inside an invocation: where it happened, innermost
// frame first followed by its callers, and the cause (errors.Is and As see
// it).
type Error struct {
	Trace []Frame
	// Dropped counts callers left out of Trace.
	Dropped int
	Err     error
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString("vm: ")
	if len(e.Trace) > 0 {
		b.WriteString(e.Trace[0].String() + ": ")
	}
	b.WriteString(e.Err.Error())
	if len(e.Trace) > 1 {
		b.WriteString("; called from ")
		for i, f := range e.Trace[1:] {
			if i > 0 {
				b.WriteString(", ")
			}
			b.WriteString(f.Func + " instruction " + strconv.Itoa(f.PC))
		}
		if e.Dropped > 0 {
			fmt.Fprintf(&b, " and %d more", e.Dropped)
		}
	}
	return b.String()
}

// Unwrap returns the cause.
func (e *Error) Unwrap() error { return e.Err }

// at adds a frame to err, making it an *Error if it is not one.
func at(err error, fr Frame) *Error {
	e, ok := err.(*Error)
	if !ok {
		return &Error{Trace: []Frame{fr}, Err: err}
	}
	if len(e.Trace) < maxTrace {
		e.Trace = append(e.Trace, fr)
	} else {
		e.Dropped++
	}
	return e
}
