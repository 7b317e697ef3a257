package redisstore

import (
	"context"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/lifetime"
)

// keepTimers drives a keeping registry: its clock and its timers, which the
// test fires, so that no test waits for a grace or a window.
type keepTimers struct {
	now     int64
	started chan keepTimer
}

type keepTimer struct {
	d time.Duration
	f func()
}

func newKeepTimers(r *lifetime.HeldRegistry, now int64) *keepTimers {
	kt := &keepTimers{now: now, started: make(chan keepTimer, 16)}
	r.Now = func() time.Time { return time.Unix(0, kt.now) }
	r.After = func(d time.Duration, f func()) { kt.started <- keepTimer{d, f} }

	return kt
}

// next returns the next timer started; the first one after a ctx is
// cancelled is started on a goroutine of context.AfterFunc's, hence the
// wait (with a deadline).
func (kt *keepTimers) next(t *testing.T) keepTimer {
	t.Helper()

	select {
	case tm := <-kt.started:
		return tm
	case <-time.After(5 * time.Second):
		t.Fatal("no timer started")
		return keepTimer{}
	}
}

// fire moves the clock to the timer's end and runs it.
func (kt *keepTimers) fire(tm keepTimer) {
	kt.now += int64(tm.d)
	tm.f()
}

// TestUnheldBlockListKeptUntilItsBlocksEnd: the Redis store's list of keys
// known blocked is kept while a block runs.
func TestUnheldBlockListKeptUntilItsBlocksEnd(t *testing.T) {
	r := lifetime.NewKeepingRegistry(BlockListLive)
	kt := newKeepTimers(r, t0)

	ctx, cancel := context.WithCancel(context.Background())
	b, _ := r.Take(ctx, "rl@file", func() interface{} { return NewBlockList(100) }).(*BlockList)
	b.Add("ip\x00args\x00", "198.51.100.7", t0+int64(time.Hour), t0)
	cancel()

	kt.fire(kt.next(t))

	tm := kt.next(t)
	if at := kt.now + int64(tm.d); at != t0+int64(time.Hour) || r.Size() != 1 {
		t.Fatalf("block list: %d entries, checked again at +%s, want kept to +1h0m0s", r.Size(), time.Duration(at-t0))
	}

	kt.fire(tm)

	if r.Size() != 0 {
		t.Fatal("block list kept after its blocks ended")
	}
}
