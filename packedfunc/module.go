package packedfunc

import (
	"fmt"
	"sync"
)

// Module is a loaded unit of code: compiled kernels, a VM executable, or a
// remote module. GetFunction looks in the module itself and then in its
// imports, in order.
type Module interface {
	// Type names the module kind ("cpu", "cuda", "vm", "remote").
	Type() string
	// GetFunction returns the function, or an error wrapping ErrNotFound.
	GetFunction(name string) (*Func, error)
	// Functions lists the names the module itself defines.
	Functions() []string
	// Imports are the modules this one depends on.
	Imports() []Module
	// Import adds a dependency searched by GetFunction.
	Import(m Module)
	// Close releases what the module holds; its functions fail afterwards.
	Close() error
}

// ImportList is an embeddable, concurrency-safe list of imported modules.
type ImportList struct {
	mu  sync.Mutex
	mod []Module
}

// Import appends a module.
func (im *ImportList) Import(m Module) {
	im.mu.Lock()
	im.mod = append(im.mod, m)
	im.mu.Unlock()
}

// Imports returns a copy of the list.
func (im *ImportList) Imports() []Module {
	im.mu.Lock()
	defer im.mu.Unlock()
	return append([]Module(nil), im.mod...)
}

// Lookup searches the imports for a function.
func (im *ImportList) Lookup(name string) (*Func, error) {
	for _, m := range im.Imports() {
		if f, err := m.GetFunction(name); err == nil {
			return f, nil
		}
	}
	return nil, fmt.Errorf("function %q: %w", name, ErrNotFound)
}
