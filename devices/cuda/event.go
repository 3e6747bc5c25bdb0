package cuda

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/kiln-ml/kiln/devices"
)

// Event is a CUDA event of one device, for timing work on its streams.
// Its methods are safe for concurrent use; Close must come last.
type Event struct {
	dev devices.Device
	ctx uintptr
	mu  sync.Mutex
	ev  uintptr // 0 once closed
}

var errEventClosed = errors.New("cuda event: closed")

// NewEvent creates an event on dev with timing enabled.
func NewEvent(dev devices.Device) (*Event, error) {
	ctx, err := contextOf(dev)
	if err != nil {
		return nil, err
	}
	ev, err := eventCreate(ctx)
	if err != nil {
		return nil, withOp(err, "create event on "+dev.String())
	}
	return &Event{dev: dev, ctx: ctx, ev: ev}, nil
}

func (e *Event) handle() (uintptr, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.ev == 0 {
		return 0, errEventClosed
	}
	return e.ev, nil
}

// Record queues the event on stream s (0: the default stream); it fires
// when the work queued on s before it has finished.
func (e *Event) Record(s devices.Stream) error {
	h, err := e.handle()
	if err != nil {
		return err
	}
	return eventRecord(e.ctx, h, uintptr(s))
}

// Synchronize waits until the event has fired.
func (e *Event) Synchronize() error {
	h, err := e.handle()
	if err != nil {
		return err
	}
	return eventSync(e.ctx, h)
}

// Elapsed is the device time from e to end, both recorded and end fired
// (call end.Synchronize first). The resolution is about half a
// microsecond.
func (e *Event) Elapsed(end *Event) (time.Duration, error) {
	if end.dev != e.dev {
		return 0, fmt.Errorf("cuda event elapsed time: events on %s and %s", e.dev, end.dev)
	}
	a, err := e.handle()
	if err != nil {
		return 0, err
	}
	b, err := end.handle()
	if err != nil {
		return 0, err
	}
	ms, err := eventElapsed(e.ctx, a, b)
	if err != nil {
		return 0, err
	}
	return time.Duration(float64(ms) * float64(time.Millisecond)), nil
}

// Close destroys the event; closing twice is harmless.
func (e *Event) Close() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.ev == 0 {
		return nil
	}
	h := e.ev
	e.ev = 0
	return eventDestroy(e.ctx, h)
}

// TimeKernel measures on the device the work that run queues on stream s:
// it records an event on s, calls run, records a second event, waits for
// it and returns the time between the two.
func TimeKernel(dev devices.Device, s devices.Stream, run func() error) (time.Duration, error) {
	start, err := NewEvent(dev)
	if err != nil {
		return 0, err
	}
	defer start.Close()
	end, err := NewEvent(dev)
	if err != nil {
		return 0, err
	}
	defer end.Close()
	if err := start.Record(s); err != nil {
		return 0, err
	}
	if err := run(); err != nil {
		return 0, err
	}
	if err := end.Record(s); err != nil {
		return 0, err
	}
	if err := end.Synchronize(); err != nil {
		return 0, err
	}
	return start.Elapsed(end)
}

// EventTimer times measurements on the device, for the time evaluator
// (its Timer): Start records an event on the default stream, Stop records
// a second, waits for it and returns the device time between the two, so
// the figure is the kernels' time, not their launches'.
type EventTimer struct{ start, stop *Event }

// NewEventTimer makes the two events of an EventTimer on dev.
func NewEventTimer(dev devices.Device) (*EventTimer, error) {
	start, err := NewEvent(dev)
	if err != nil {
		return nil, err
	}
	stop, err := NewEvent(dev)
	if err != nil {
		start.Close()
		return nil, err
	}
	return &EventTimer{start: start, stop: stop}, nil
}

// Start records the first event on the default stream.
func (t *EventTimer) Start() error { return t.start.Record(0) }

// Stop records the second event on the default stream, waits for it and
// returns the device time since Start.
func (t *EventTimer) Stop() (time.Duration, error) {
	if err := t.stop.Record(0); err != nil {
		return 0, err
	}
	if err := t.stop.Synchronize(); err != nil {
		return 0, err
	}
	return t.start.Elapsed(t.stop)
}

// Close destroys the events; closing twice is harmless.
func (t *EventTimer) Close() error {
	return errors.Join(t.start.Close(), t.stop.Close())
}
