package memstore

import (
	"context"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/config"
	"github.com/tierlimit/tierlimit/lifetime"
	"github.com/tierlimit/tierlimit/limit"
	"github.com/tierlimit/tierlimit/rule"
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

func (kt *keepTimers) none(t *testing.T) {
	t.Helper()

	select {
	case tm := <-kt.started:
		t.Fatalf("a timer of %s started", tm.d)
	default:
	}
}

// TestUnheldCountersOutliveTheGraceUntilTheirEnd: a middleware disabled by
// a bad reload, or removed, keeps its counters past the grace while they
// hold something (a window, a sliding window's weight, a token bucket's
// debt, a calendar period, a block), and is released once they all ended.
func TestUnheldCountersOutliveTheGraceUntilTheirEnd(t *testing.T) {
	day := time.Date(2026, 6, 16, 0, 0, 0, 0, time.UTC).UnixNano() // t0's day ends

	cases := []struct {
		name string
		spec config.Rule
		hits int
		end  int64 // when the counts stop mattering
	}{
		{"fixed", config.Rule{Name: "ip", Points: 5, Duration: 10 * time.Minute}, 3, t0 + int64(10*time.Minute)},
		{"sliding", config.Rule{Name: "ip", Points: 5, Duration: time.Minute, Algorithm: limit.Sliding}, 3, t0 + int64(2*time.Minute)},
		{"tokenbucket", config.Rule{Name: "ip", Points: 1, Duration: time.Minute, Algorithm: limit.TokenBucket, Burst: 5}, 3, t0 + int64(3*time.Minute)},
		{"calendar day", config.Rule{Name: "ip", Points: 5, Duration: 24 * time.Hour, Calendar: limit.Day}, 3, day},
		{"block", config.Rule{Name: "ip", Points: 2, Duration: time.Minute, BlockDuration: time.Hour}, 3, t0 + int64(time.Hour)},
	}

	for _, c := range cases {
		r := lifetime.NewKeepingRegistry(Live)
		kt := newKeepTimers(r, t0)

		var l *rule.Layer

		s, grace := keepStore(t, r, kt, func(s *WindowStore) {
			l = newLayer(s, c.spec, rule.KeyOfClient)

			for i := 0; i < c.hits; i++ {
				takeIn(s, t0, []*rule.Layer{l}, "198.51.100.7", false)
			}
		})

		// The grace ends: the counts still matter, so the entry stays and
		// is checked again at their end.
		kt.fire(grace)

		if r.Size() != 1 {
			t.Fatalf("%s: counters released at the grace while they still count", c.name)
		}

		tm := kt.next(t)
		if at := kt.now + int64(tm.d); at != c.end {
			t.Fatalf("%s: checked again at %s, want %s (when its counts end)", c.name, time.Unix(0, at).UTC(), time.Unix(0, c.end).UTC())
		}

		// The same name configured again meanwhile takes its counts back.
		if again, _ := r.Take(context.Background(), "rl@file", newTestStore).(*WindowStore); again != s {
			t.Fatalf("%s: the middleware configured again got new counters", c.name)
		}

		kt.fire(tm) // held: a stale timer releases nothing

		if r.Size() != 1 {
			t.Fatalf("%s: released while held again", c.name)
		}
	}
}

// TestUnheldCountersReleasedWhenTheyEnd: kept past the grace, the store is
// released at the end of its last window; an empty store, or one whose
// windows all ended, goes at the grace as before.
func TestUnheldCountersReleasedWhenTheyEnd(t *testing.T) {
	r := lifetime.NewKeepingRegistry(Live)
	kt := newKeepTimers(r, t0)

	_, grace := keepStore(t, r, kt, func(s *WindowStore) {
		l := testLayer(s, "ip", 5, 10*time.Minute)
		takeIn(s, t0, []*rule.Layer{l}, "198.51.100.7", false)
		takeIn(s, t0+int64(time.Minute), []*rule.Layer{l}, "198.51.100.8", false)
	})

	kt.fire(grace)

	// Checked again when the later window ends (t0 + 11 min), then released.
	tm := kt.next(t)
	if at := kt.now + int64(tm.d); at != t0+int64(11*time.Minute) {
		t.Fatalf("checked again at +%s, want +11m0s", time.Duration(at-t0))
	}

	kt.fire(tm)

	if r.Size() != 0 {
		t.Fatal("kept after its last window ended")
	}

	kt.none(t)

	for _, name := range []string{"empty", "ended"} {
		r := lifetime.NewKeepingRegistry(Live)
		kt := newKeepTimers(r, t0)
		name := name

		_, grace := keepStore(t, r, kt, func(s *WindowStore) {
			if name == "ended" {
				l := testLayer(s, "ip", 5, time.Second)
				takeIn(s, t0, []*rule.Layer{l}, "198.51.100.7", false)
			}
		})

		kt.fire(grace)

		if r.Size() != 0 {
			t.Fatalf("%s store kept past the grace", name)
		}

		kt.none(t)
	}
}

func newTestStore() interface{} { return NewWindowStore(100) }

// keepStore is a middleware's memory store taken from r by one instance
// whose configuration is then replaced (its ctx cancelled); it returns the
// store and the grace timer that started.
func keepStore(t *testing.T, r *lifetime.HeldRegistry, kt *keepTimers, charge func(s *WindowStore)) (*WindowStore, keepTimer) {
	t.Helper()

	ctx, cancel := context.WithCancel(context.Background())
	s, _ := r.Take(ctx, "rl@file", newTestStore).(*WindowStore)
	charge(s)
	cancel()

	tm := kt.next(t)
	if tm.d != lifetime.ReleaseGrace {
		t.Fatalf("first timer %s, want the grace", tm.d)
	}

	return s, tm
}

func TestRegistrySharesStoresByName(t *testing.T) {
	a := StoreOf(context.Background(), "shared-test@file", 10)
	b := StoreOf(context.Background(), "shared-test@file", 20)
	c := StoreOf(context.Background(), "other-test@file", 10)

	if a != b {
		t.Fatal("same middleware name got two stores")
	}

	if a == c {
		t.Fatal("different middleware names share a store")
	}

	if a.Max != 20 {
		t.Fatalf("reload did not apply maxTracked: %d", a.Max)
	}
}
