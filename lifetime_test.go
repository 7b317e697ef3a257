package tierlimit

import (
	"testing"
	"time"
)

// fakeTimers stands in for time.AfterFunc: the grace timers are fired by the
// test, so no test waits for releaseGrace.
type fakeTimers struct {
	started chan func()
}

func newFakeTimers(r *heldRegistry) *fakeTimers {
	ft := &fakeTimers{started: make(chan func(), 16)}
	r.After = func(d time.Duration, f func()) {
		if d != releaseGrace {
			panic("grace timer of " + d.String())
		}

		ft.started <- f
	}

	return ft
}

// next returns the next grace timer started; context.AfterFunc runs the
// release on a goroutine of its own, hence the wait (with a deadline).
func (ft *fakeTimers) next(t *testing.T) func() {
	t.Helper()

	select {
	case f := <-ft.started:
		return f
	case <-time.After(5 * time.Second):
		t.Fatal("no grace timer started after the last holder's ctx was cancelled")
		return nil
	}
}
