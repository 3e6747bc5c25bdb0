package store

import (
	"errors"
	"sync"
)

// groupCommit is the write queue both backends share: Apply queues changes
// in order, and batches of them go to the store's commit function, from a
// commit loop or, when no commit is running, from a caller waiting in
// Wait, which saves a hand-off between goroutines on a machine short of
// CPU. commit must answer every write of its batch on its done channel.
type groupCommit struct {
	commit func(batch []pendingWrite)

	// commitMu is held by whichever goroutine commits a batch: the commit
	// loop, or a caller in Wait that found no commit running.
	commitMu sync.Mutex

	mu      sync.Mutex
	queue   []pendingWrite
	wake    chan struct{} // 1-buffered: the committer has work
	closing bool
	done    chan struct{} // closed when the commit loop has returned
}

// pendingWrite is the changes of one Apply call and where its result goes.
type pendingWrite struct {
	changes []Change
	done    chan error // 1-buffered
}

// start starts the commit loop, which hands batches to commit.
func (g *groupCommit) start(commit func(batch []pendingWrite)) {
	g.commit = commit
	g.wake = make(chan struct{}, 1)
	g.done = make(chan struct{})
	go g.loop()
}

func (g *groupCommit) Apply(changes ...Change) <-chan error {
	done := make(chan error, 1)
	g.mu.Lock()
	if g.closing {
		g.mu.Unlock()
		done <- errors.New("tracker store is closed")
		return done
	}
	g.queue = append(g.queue, pendingWrite{changes: changes, done: done})
	g.mu.Unlock()
	select {
	case g.wake <- struct{}{}:
	default:
	}
	return done
}

// take removes and returns the queued writes, and whether the store is
// closing.
func (g *groupCommit) take() ([]pendingWrite, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	batch := g.queue
	g.queue = nil
	return batch, g.closing
}

// Wait returns the result of the write whose channel is done. When no
// commit is running it commits the queue itself rather than waking the
// commit loop and waiting for it: one hand-off less between a write and
// its caller's answer.
func (g *groupCommit) Wait(done <-chan error) error {
	select {
	case err := <-done:
		return err
	default:
	}
	if g.commitMu.TryLock() {
		if batch, _ := g.take(); len(batch) > 0 {
			g.commit(batch)
		}
		g.commitMu.Unlock()
	}
	// Either that commit held this write, or an earlier one did, or the
	// commit loop (woken when the write was queued) is applying it now.
	return <-done
}

func (g *groupCommit) loop() {
	defer close(g.done)
	for {
		g.commitMu.Lock()
		batch, closing := g.take()
		if len(batch) > 0 {
			g.commit(batch)
		}
		g.commitMu.Unlock()
		if len(batch) > 0 {
			continue
		}
		if closing {
			return
		}
		<-g.wake
	}
}

// stop refuses new writes, commits what is queued and waits for the
// commit loop to return. It reports whether the store was already
// stopping.
func (g *groupCommit) stop() (already bool) {
	g.mu.Lock()
	already = g.closing
	g.closing = true
	g.mu.Unlock()
	if !already {
		select {
		case g.wake <- struct{}{}:
		default:
		}
	}
	<-g.done
	return already
}

// stopping reports whether stop has been called.
func (g *groupCommit) stopping() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.closing
}

// answer sends err to every write of batch.
func answer(batch []pendingWrite, err error) {
	for _, w := range batch {
		w.done <- err
	}
}
