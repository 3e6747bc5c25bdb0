package packedfunc

import (
	"errors"
	"fmt"
	"sort"
	"sync"
)

// Impl is the body of a Func.
type Impl func(args []Value) (Value, error)

// Func is a named function over Values. Calls are safe for concurrent use
// when the body is.
type Func struct {
	name string
	impl Impl
}

// New makes a Func from a body.
func New(name string, impl Impl) *Func { return &Func{name: name, impl: impl} }

// Name is the function's name.
func (f *Func) Name() string { return f.name }

// Call runs the function. f.Call(args...) with an existing slice does not
// allocate.
func (f *Func) Call(args ...Value) (Value, error) { return f.impl(args) }

// ArgError builds the error for a bad argument, an *ArgumentError: it
// names the function, the argument's position and what was wrong; format
// may use %w.
func ArgError(fn string, i int, format string, a ...any) error {
	return &ArgumentError{Func: fn, Index: i, Err: fmt.Errorf(format, a...)}
}

// ArgumentError is a function's refusal of one of its arguments (a wrong
// shape, dtype or device): "fn: argument i: what was wrong". It matches
// ErrArgument.
type ArgumentError struct {
	Func  string
	Index int
	Err   error // what was wrong with the argument
}

func (e *ArgumentError) Error() string {
	return fmt.Sprintf("%s: argument %d: %v", e.Func, e.Index, e.Err)
}

// Unwrap returns what was wrong.
func (e *ArgumentError) Unwrap() error { return e.Err }

// Is makes the error match ErrArgument.
func (e *ArgumentError) Is(target error) bool { return target == ErrArgument }

// Sentinel errors of the registry and modules.
var (
	// ErrExists: a global function of that name is already registered.
	ErrExists = errors.New("global function already registered")
	// ErrNotFound: no function of that name.
	ErrNotFound = errors.New("function not found")
	// ErrArity: a call with the wrong number of arguments.
	ErrArity = errors.New("wrong number of arguments")
	// ErrArgument: a call with an argument the function refuses
	// (ArgumentError).
	ErrArgument = errors.New("bad argument")
)

var globals struct {
	sync.RWMutex
	m map[string]*Func
}

// Register installs a global function. A name that is taken is refused
// with ErrExists unless override is true.
func Register(name string, f *Func, override bool) error {
	if name == "" {
		return errors.New("register: empty function name")
	}
	if f == nil {
		return fmt.Errorf("register %q: nil function", name)
	}
	globals.Lock()
	defer globals.Unlock()
	if globals.m == nil {
		globals.m = map[string]*Func{}
	}
	if _, taken := globals.m[name]; taken && !override {
		return fmt.Errorf("register %q: %w (pass override to replace it)", name, ErrExists)
	}
	globals.m[name] = f
	return nil
}

// MustRegister registers a built-in function at init; a clash panics, as it
// is a programming error.
func MustRegister(name string, fn any) {
	f, err := Wrap(name, fn)
	if err == nil {
		err = Register(name, f, false)
	}
	if err != nil {
		panic(err)
	}
}

// Unregister removes a global function; it reports whether one was there.
func Unregister(name string) bool {
	globals.Lock()
	defer globals.Unlock()
	_, ok := globals.m[name]
	delete(globals.m, name)
	return ok
}

// Get returns a global function.
func Get(name string) (*Func, error) {
	globals.RLock()
	f, ok := globals.m[name]
	globals.RUnlock()
	if !ok {
		return nil, fmt.Errorf("global %q: %w", name, ErrNotFound)
	}
	return f, nil
}

// List returns the names of all global functions, sorted.
func List() []string {
	globals.RLock()
	defer globals.RUnlock()
	out := make([]string, 0, len(globals.m))
	for n := range globals.m {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}
