package tierlimit

import (
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/config"
	"github.com/tierlimit/tierlimit/limit"
	"github.com/tierlimit/tierlimit/memstore"
)

// TestSlidingWaitIsTheFirstAllowedMoment checks limit.SlidingWait against a brute
// force walk of the clock: the wait it returns is the first moment at which
// limit.SlidingCount allows a request, within the window or in the next one.
func TestSlidingWaitIsTheFirstAllowedMoment(t *testing.T) {
	const d = 20

	for points := int64(1); points <= 6; points++ {
		for prev := int64(0); prev <= 8; prev++ {
			for count := int64(0); count <= points; count++ {
				for left := int64(1); left <= d; left++ {
					if limit.SlidingCount(prev, count, 1, left, d) <= points {
						continue // not a refusal
					}

					want := int64(0)

					for x := int64(1); x <= left+d; x++ {
						est := int64(0)
						if x < left {
							est = limit.SlidingCount(prev, count, 1, left-x, d)
						} else {
							est = limit.SlidingCount(count, 0, 1, d-(x-left), d)
						}

						if est <= points {
							want = x
							break
						}
					}

					if got := limit.SlidingWait(prev, count, 1, points, left, d); got != want {
						t.Fatalf("points %d prev %d count %d left %d: wait %d, want %d", points, prev, count, left, got, want)
					}
				}
			}
		}
	}
}

// TestSlidingRemovesTheBoundaryBurst spends a layer's points at the end of one
// window and again at the start of the next: a fixed window lets both bursts
// through, a sliding one refuses most of the second.
func TestSlidingRemovesTheBoundaryBurst(t *testing.T) {
	for _, sliding := range []bool{false, true} {
		s := memstore.NewWindowStore(100)
		l := newLayer(s, config.Rule{Name: "ip", Points: 10, Duration: 10 * time.Second, Sliding: sliding}, keyOfClient)
		start := time.Unix(1000, 0).UnixNano()

		burst := func(at int64, n int) (allowed int, last tally) {
			for i := 0; i < n; i++ {
				var tl tally
				take(storeOf(s), &tl, chargeOf([]*layer{l}, "203.0.113.1", "", nil, at, false))

				if !tl.Refused {
					allowed++
				}

				last = tl
			}

			return allowed, last
		}

		// The first hit opens the window at start; nine more at its very end.
		burst(start, 1)

		if got, _ := burst(start+int64(9900*time.Millisecond), 9); got != 9 {
			t.Fatalf("sliding %v: end of the first window: %d of 9 allowed", sliding, got)
		}

		got, last := burst(start+int64(10100*time.Millisecond), 10)

		if !sliding {
			if got != 10 {
				t.Fatalf("fixed: %d of the second burst allowed, want 10", got)
			}

			continue
		}

		// 10 x 9.9s/10s of the previous window still weigh 9: one more fits.
		if got != 1 {
			t.Fatalf("sliding: %d of the second burst allowed, want 1", got)
		}

		if !last.Refused || last.Count != 11 {
			t.Fatalf("sliding: last request %+v, want refused with estimate 11", last)
		}

		// The refusal's reset is when the next request fits: then one is
		// allowed, and not a millisecond earlier.
		wait := last.Reset

		if n, _ := burst(wait-int64(time.Millisecond), 1); n != 0 {
			t.Fatalf("sliding: allowed before the reported reset")
		}

		if n, _ := burst(wait, 1); n != 1 {
			t.Fatalf("sliding: refused at the reported reset")
		}
	}
}

// TestSlidingCountsOnlyAllowedRequests: a client that keeps retrying above the
// limit is let through again once the window has slid, because its refusals
// did not count, and no faster than the previous window's weight allows.
func TestSlidingCountsOnlyAllowedRequests(t *testing.T) {
	s := memstore.NewWindowStore(100)
	l := newLayer(s, config.Rule{Name: "ip", Points: 5, Duration: time.Second, Sliding: true}, keyOfClient)
	now := time.Unix(2000, 0).UnixNano()

	var allowed []int // milliseconds after the first request

	// 100 requests per window, for 10 windows, evenly spread.
	for i := 0; i < 1000; i++ {
		var tl tally
		take(storeOf(s), &tl, chargeOf([]*layer{l}, "c", "", nil, now+int64(i)*int64(10*time.Millisecond), false))

		if !tl.Refused {
			allowed = append(allowed, i*10)
		}
	}

	// The first window allows its first 5 requests. In each later one the
	// previous window's 5 weigh 5 x left / 1s, so the n-th request (from 0)
	// fits once that weight is down to 4 - n: after 10, 210, ... 810 ms.
	want := []int{0, 10, 20, 30, 40}
	for w := 1; w < 10; w++ {
		for n := 0; n < 5; n++ {
			want = append(want, w*1000+10+n*200)
		}
	}

	if len(allowed) != len(want) {
		t.Fatalf("%d of 1000 allowed over 10 windows of 5 points, want %d: at %v ms", len(allowed), len(want), allowed)
	}

	for i := range want {
		if allowed[i] != want[i] {
			t.Fatalf("allowed at %v ms, want %v", allowed, want)
		}
	}
}

// TestSlidingExpiresAfterTwoWindows: a sliding counter is kept one window past
// its end, since it weighs on the next, and dropped after.
func TestSlidingExpiresAfterTwoWindows(t *testing.T) {
	s := memstore.NewWindowStore(100)
	l := newLayer(s, config.Rule{Name: "ip", Points: 3, Duration: time.Second, Sliding: true}, keyOfClient)
	f := newLayer(s, config.Rule{Name: "f", Points: 3, Duration: time.Second}, keyOfClient)
	now := time.Unix(3000, 0).UnixNano()

	var tl tally
	take(storeOf(s), &tl, chargeOf([]*layer{l, f}, "a", "", nil, now, false))

	if l.List == f.List {
		t.Fatal("a sliding and a fixed layer of one duration share a list")
	}

	// A new key after 1.5 windows purges the fixed counter, not the sliding one.
	take(storeOf(s), &tl, chargeOf([]*layer{f}, "b", "", nil, now+int64(1500*time.Millisecond), false))
	take(storeOf(s), &tl, chargeOf([]*layer{l}, "b", "", nil, now+int64(1500*time.Millisecond), false))

	if _, ok := l.Entries["a"]; !ok {
		t.Fatal("sliding counter dropped within its second window")
	}

	if _, ok := f.Entries["a"]; ok {
		t.Fatal("expired fixed counter kept")
	}

	take(storeOf(s), &tl, chargeOf([]*layer{l}, "c", "", nil, now+int64(2500*time.Millisecond), false))

	if _, ok := l.Entries["a"]; ok {
		t.Fatal("sliding counter kept past two windows")
	}
}
