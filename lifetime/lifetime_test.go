package lifetime

import (
	"context"
	"testing"
	"time"
)

// fakeTimers stands in for time.AfterFunc: the grace timers are fired by the
// test, so no test waits for ReleaseGrace.
type fakeTimers struct {
	started chan func()
}

func newFakeTimers(r *HeldRegistry) *fakeTimers {
	ft := &fakeTimers{started: make(chan func(), 16)}
	r.After = func(d time.Duration, f func()) {
		if d != ReleaseGrace {
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

func (ft *fakeTimers) none(t *testing.T) {
	t.Helper()

	select {
	case <-ft.started:
		t.Fatal("a grace timer started while the entry is still held")
	default:
	}
}

func newValue() interface{} { return new(int) }

func TestHeldRegistryKeepsAnEntryTakenAgainWithinTheGrace(t *testing.T) {
	var closed []interface{}

	r := NewHeldRegistry(func(v interface{}) { closed = append(closed, v) })
	ft := newFakeTimers(r)

	// Two routers of the first configuration use the middleware.
	ctx1, cancel1 := context.WithCancel(context.Background())
	a := r.Take(ctx1, "mw@file", newValue)

	if b := r.Take(ctx1, "mw@file", newValue); b != a {
		t.Fatal("two instances of one configuration got two entries")
	}

	// Traefik cancels the first configuration's ctx, then builds the next.
	cancel1()

	fire := ft.next(t)

	ctx2, cancel2 := context.WithCancel(context.Background())
	defer cancel2()

	if b := r.Take(ctx2, "mw@file", newValue); b != a {
		t.Fatal("the next configuration's New got a new entry: counters lost at the reload")
	}

	fire()

	if r.Size() != 1 || len(closed) != 0 {
		t.Fatalf("an entry the next configuration holds was released: %d entries, closed %v", r.Size(), closed)
	}

	ft.none(t)
}

func TestHeldRegistryReleasesAnEntryNobodyTookAgain(t *testing.T) {
	var closed []interface{}

	r := NewHeldRegistry(func(v interface{}) { closed = append(closed, v) })
	ft := newFakeTimers(r)

	ctx, cancel := context.WithCancel(context.Background())
	a := r.Take(ctx, "old@file", newValue)
	cancel()
	ft.next(t)()

	if r.Size() != 0 || len(closed) != 1 || closed[0] != a {
		t.Fatalf("after the grace: %d entries, closed %v", r.Size(), closed)
	}

	// Taken again later, it is a new entry.
	if b := r.Take(context.Background(), "old@file", newValue); b == a {
		t.Fatal("a released entry came back")
	}
}

func TestHeldRegistryIgnoresAGraceTimerOlderThanTheLastRelease(t *testing.T) {
	r := NewHeldRegistry(nil)
	ft := newFakeTimers(r)

	ctx1, cancel1 := context.WithCancel(context.Background())
	r.Take(ctx1, "mw@file", newValue)
	cancel1()

	first := ft.next(t)

	ctx2, cancel2 := context.WithCancel(context.Background())
	r.Take(ctx2, "mw@file", newValue)
	cancel2()

	second := ft.next(t)

	// The first timer ends less than a grace after the second release.
	first()

	if r.Size() != 1 {
		t.Fatal("released by a timer started before the entry was taken again")
	}

	second()

	if r.Size() != 0 {
		t.Fatal("not released a grace after its last holder went")
	}
}

func TestHeldRegistryHeldForeverWithoutCancellation(t *testing.T) {
	r := NewHeldRegistry(nil)
	ft := newFakeTimers(r)

	r.Take(context.Background(), "mw@file", newValue)
	ft.none(t)

	if r.Size() != 1 {
		t.Fatal("entry lost")
	}
}

func TestHeldRegistryCallbacksRecoverFromPanics(t *testing.T) {
	r := NewHeldRegistry(func(interface{}) { panic("closing") })
	ft := newFakeTimers(r)

	ctx, cancel := context.WithCancel(context.Background())
	r.Take(ctx, "mw@file", newValue)
	cancel()

	ft.next(t)() // would take the test binary down if it panicked

	if r.Size() != 0 {
		t.Fatal("entry kept")
	}
}
