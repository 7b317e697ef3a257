package limit

import (
	"testing"
	"time"
)

// The expected values below are worked out by hand from each function's
// formula (its doc comment), not computed by the code under test.

func TestFits(t *testing.T) {
	for _, c := range []struct {
		count, cost, points int64
		want                bool
	}{
		{0, 1, 10, true},
		{9, 1, 10, true},   // exactly at the points
		{10, 1, 10, false}, // one above
		{5, 5, 10, true},
		{5, 6, 10, false},
		{0, 11, 10, false}, // a cost above the points never fits
		{0, 10, 10, true},
		{10, 0, 10, true}, // nothing more at the points
	} {
		if got := Fits(c.count, c.cost, c.points); got != c.want {
			t.Errorf("Fits(%d, %d, %d) = %v, want %v", c.count, c.cost, c.points, got, c.want)
		}
	}
}

func TestAligned(t *testing.T) {
	const minute = int64(time.Minute)

	for _, c := range []struct {
		now, d, start, end int64
	}{
		{0, 10, 0, 10},
		{9, 10, 0, 10},
		{10, 10, 10, 20}, // exactly at a boundary: the window that starts there
		{25, 10, 20, 30},
		// 1700000000.123456789 s: 28333333 whole minutes are 1699999980 s.
		{1700000000123456789, minute, 1699999980 * int64(time.Second), 1700000040 * int64(time.Second)},
	} {
		start, end := Aligned(c.now, c.d)
		if start != c.start || end != c.end {
			t.Errorf("Aligned(%d, %d) = %d, %d, want %d, %d", c.now, c.d, start, end, c.start, c.end)
		}
	}
}

func TestCeilMillis(t *testing.T) {
	for _, c := range []struct{ ns, want int64 }{
		{0, 0},
		{1, 1},
		{999999, 1},
		{1000000, 1}, // exactly one
		{1000001, 2},
		{2500000, 3},
	} {
		if got := CeilMillis(c.ns); got != c.want {
			t.Errorf("CeilMillis(%d) = %d, want %d", c.ns, got, c.want)
		}
	}
}

func TestCeilSeconds(t *testing.T) {
	const s = int64(time.Second)

	for _, c := range []struct{ ns, want int64 }{
		{0, 0},
		{1, 1},
		{s, 1}, // exactly one
		{s + 1, 2},
		{-1, 0},      // a time before the epoch rounds towards it
		{-s, -1},     // exactly one before
		{-s - 1, -1}, // still rounded up
	} {
		if got := CeilSeconds(c.ns); got != c.want {
			t.Errorf("CeilSeconds(%d) = %d, want %d", c.ns, got, c.want)
		}
	}
}

func TestPeriod(t *testing.T) {
	day := func(y int, m time.Month, d, h int) int64 { return time.Date(y, m, d, h, 0, 0, 0, time.UTC).UnixNano() }
	now := day(2026, time.December, 3, 12) // a Thursday
	east2h := int64(2 * time.Hour)

	for _, c := range []struct {
		name               string
		now                int64
		calendar           int
		offset             int64
		wantStart, wantEnd int64
	}{
		{"day", now, Day, 0, day(2026, time.December, 3, 0), day(2026, time.December, 4, 0)},
		{"day at its first instant", day(2026, time.December, 3, 0), Day, 0, day(2026, time.December, 3, 0), day(2026, time.December, 4, 0)},
		{"week from Monday", now, Week, 0, day(2026, time.November, 30, 0), day(2026, time.December, 7, 0)},
		{"month into the next year", now, Month, 0, day(2026, time.December, 1, 0), day(2027, time.January, 1, 0)},
		// 23:00 UTC is 01:00 of the next day two hours east: that day, from
		// its 00:00 there (22:00 UTC).
		{"day east of UTC", day(2026, time.December, 3, 23), Day, east2h, day(2026, time.December, 3, 22), day(2026, time.December, 4, 22)},
	} {
		start, end := Period(c.now, c.calendar, c.offset)
		if start != c.wantStart || end != c.wantEnd {
			t.Errorf("%s: Period = %v, %v, want %v, %v", c.name,
				time.Unix(0, start).UTC(), time.Unix(0, end).UTC(), time.Unix(0, c.wantStart).UTC(), time.Unix(0, c.wantEnd).UTC())
		}
	}
}

func TestSlidingCount(t *testing.T) {
	for _, c := range []struct {
		prev, count, cost, toEnd, d, want int64
	}{
		{0, 0, 1, 10, 10, 1},
		{10, 0, 1, 10, 10, 11}, // a window that just started: all of the previous one weighs
		{10, 0, 1, 5, 10, 6},   // half of it
		{10, 3, 1, 5, 10, 9},
		{7, 2, 1, 3, 10, 5},    // 2 + 1 + floor(21 / 10)
		{10, 4, 0, 0, 10, 4},   // a window at its end: the previous one weighs nothing
		{0, 0, 11, 10, 10, 11}, // a cost above the points is counted whole
	} {
		if got := SlidingCount(c.prev, c.count, c.cost, c.toEnd, c.d); got != c.want {
			t.Errorf("SlidingCount(%d, %d, %d, %d, %d) = %d, want %d", c.prev, c.count, c.cost, c.toEnd, c.d, got, c.want)
		}
	}
}

// Each case is a refusal (SlidingCount above points); the wait is checked
// by hand at the moment it names and the one before.
func TestSlidingWait(t *testing.T) {
	for _, c := range []struct {
		name                                string
		prev, count, cost, points, toEnd, d int64
		want                                int64
	}{
		// In this window: at 6, 4 to its end: 1 + 4 = 5 fits; at 5: 1 + 5 = 6.
		{"in this window", 10, 0, 1, 5, 10, 10, 6},
		// At 2, 4 to its end: 2 + floor(28 / 10) = 4 fits; at 1: 2 + 3 = 5.
		{"in this window, rounded", 7, 1, 1, 4, 6, 10, 2},
		// Only once the window ends (3 to its end): 4 + 1 = 5, the points exactly.
		{"when this window ends", 10, 4, 1, 5, 3, 10, 3},
		// Full window: in the next one, at 1 in (9 to its end): 1 + floor(5 x 9
		// / 10) = 5 fits; at its start: 1 + 5 = 6.
		{"in the next window", 0, 5, 1, 5, 4, 10, 5},
		// 2 + floor(4 x 9 / 10) = 5 at 1 into the next window.
		{"in the next window, cost 2", 0, 4, 2, 5, 2, 10, 3},
		// A cost above the points never fits: a whole window after this one.
		{"a cost above the points", 0, 3, 6, 5, 4, 10, 14},
		{"a cost above the points, empty window", 0, 0, 6, 5, 4, 10, 14},
	} {
		if SlidingCount(c.prev, c.count, c.cost, c.toEnd, c.d) <= c.points {
			t.Fatalf("%s: not a refusal", c.name)
		}

		if got := SlidingWait(c.prev, c.count, c.cost, c.points, c.toEnd, c.d); got != c.want {
			t.Errorf("%s: SlidingWait(%d, %d, %d, %d, %d, %d) = %d, want %d", c.name, c.prev, c.count, c.cost, c.points, c.toEnd, c.d, got, c.want)
		}
	}
}

func TestSlidingAt(t *testing.T) {
	for _, c := range []struct {
		name                         string
		prev, count, end, now, d     int64
		wantPrev, wantCount, wantEnd int64
	}{
		{"before its end", 3, 4, 100, 99, 10, 3, 4, 100},
		{"a window that just ended", 3, 4, 100, 100, 10, 4, 0, 110},
		{"within the window after", 3, 4, 100, 109, 10, 4, 0, 110},
		{"the window after just ended", 3, 4, 100, 110, 10, 0, 0, 120},
		{"long after", 3, 4, 100, 250, 10, 0, 0, 260},
	} {
		prev, count, end := SlidingAt(c.prev, c.count, c.end, c.now, c.d)
		if prev != c.wantPrev || count != c.wantCount || end != c.wantEnd {
			t.Errorf("%s: SlidingAt = %d, %d, %d, want %d, %d, %d", c.name, prev, count, end, c.wantPrev, c.wantCount, c.wantEnd)
		}
	}
}

// A bucket of 5 tokens refilled one per 10: full again 50 after it was
// emptied.
func TestBucketTake(t *testing.T) {
	const burst, interval = 5, 10

	for _, c := range []struct {
		name              string
		tat, now, cost    int64
		wantTAT, wantUsed int64
	}{
		{"a bucket refilled to full", 50, 100, 1, 110, 1},
		{"a full bucket, TAT at now", 100, 100, 1, 110, 1},
		{"the whole burst at once", 100, 100, 5, 150, 5},
		{"a cost above the burst", 100, 100, 6, 110, 6},
		{"3 in use, 2 more: exactly the burst", 130, 100, 2, 150, 5},
		{"3 in use, 3 more: refused until 1 is back", 130, 100, 3, 110, 6},
		{"2.5 in use count as 3", 125, 100, 1, 135, 4},
		{"empty: refused until a token is back", 150, 100, 1, 110, 6},
		{"read", 125, 100, 0, 125, 3},
		{"read an empty bucket", 150, 100, 0, 150, 5},
		{"read a bucket refilled to full", 90, 100, 0, 100, 0},
		{"read a bucket over its burst", 160, 100, 0, 110, 6},
	} {
		tat, used := BucketTake(c.tat, c.now, c.cost, burst, interval)
		if tat != c.wantTAT || used != c.wantUsed {
			t.Errorf("%s: BucketTake(%d, %d, %d, %d, %d) = %d, %d, want %d, %d",
				c.name, c.tat, c.now, c.cost, burst, interval, tat, used, c.wantTAT, c.wantUsed)
		}
	}
}

func TestBucketReturn(t *testing.T) {
	for _, c := range []struct{ tat, cost, interval, want int64 }{
		{150, 2, 10, 130},
		{105, 1, 10, 95}, // before now: full
		{150, 0, 10, 150},
		// Past the horizon, where a spend saturated: no overflow.
		{BucketHorizon, int64(1) << 40, 180e9, 0},
		{BucketHorizon, BucketHorizon/10 + 1, 10, 0},
	} {
		if got := BucketReturn(c.tat, c.cost, c.interval); got != c.want {
			t.Errorf("BucketReturn(%d, %d, %d) = %d, want %d", c.tat, c.cost, c.interval, got, c.want)
		}
	}
}

func TestLeaseGrant(t *testing.T) {
	tests := []struct {
		points, total, need, want, grant int64
	}{
		{200, 0, 1, 1000, 50},   // a quarter of what is left
		{200, 150, 1, 1000, 13}, // 50 left: 12.5 rounded up
		{200, 197, 1, 1000, 1},  // 3 left: the last points one at a time
		{200, 199, 1, 1000, 1},
		{200, 200, 1, 1000, 0}, // nothing left
		{200, 230, 0, 1000, 0}, // over, after an outage's charges
		{200, 0, 1, 10, 10},    // no more than wanted
		{200, 190, 5, 1000, 5}, // a need above the share
		{200, 197, 5, 1000, 0}, // 3 left cannot cover 5: nothing
		{200, 0, 0, 0, 0},      // nothing wanted
		{200, 0, 0, 30, 30},    // a top-up
		{1, 0, 1, 1000, 1},
	}

	for _, tt := range tests {
		if got := LeaseGrant(tt.points, tt.total, tt.need, tt.want); got != tt.grant {
			t.Errorf("LeaseGrant(%d, %d, %d, %d) = %d, want %d", tt.points, tt.total, tt.need, tt.want, got, tt.grant)
		}
	}
}

// TestSlidingWaitIsTheFirstAllowedMoment checks SlidingWait against a brute
// force walk of the clock: the wait it returns is the first moment at which
// SlidingCount allows a request, within the window or in the next one.
func TestSlidingWaitIsTheFirstAllowedMoment(t *testing.T) {
	const d = 20

	for points := int64(1); points <= 6; points++ {
		for prev := int64(0); prev <= 8; prev++ {
			for count := int64(0); count <= points; count++ {
				for toEnd := int64(1); toEnd <= d; toEnd++ {
					if SlidingCount(prev, count, 1, toEnd, d) <= points {
						continue // not a refusal
					}

					want := int64(0)

					for x := int64(1); x <= toEnd+d; x++ {
						est := int64(0)
						if x < toEnd {
							est = SlidingCount(prev, count, 1, toEnd-x, d)
						} else {
							est = SlidingCount(count, 0, 1, d-(x-toEnd), d)
						}

						if est <= points {
							want = x
							break
						}
					}

					if got := SlidingWait(prev, count, 1, points, toEnd, d); got != want {
						t.Fatalf("points %d prev %d count %d toEnd %d: wait %d, want %d", points, prev, count, toEnd, got, want)
					}
				}
			}
		}
	}
}

// Full is Fits of a cost of 1, negated, for every count around the points.
func TestFullIsNoRoomForOne(t *testing.T) {
	for count := int64(0); count <= 12; count++ {
		if got, want := Full(count, 10), !Fits(count, 1, 10); got != want {
			t.Errorf("Full(%d, 10) = %v, want %v", count, got, want)
		}
	}
}

func TestLeft(t *testing.T) {
	for _, c := range []struct{ count, points, want int64 }{
		{0, 10, 10},
		{4, 10, 6},
		{10, 10, 0},
		{12, 10, -2}, // a dry-run window past its points
	} {
		if got := Left(c.count, c.points); got != c.want {
			t.Errorf("Left(%d, %d) = %d, want %d", c.count, c.points, got, c.want)
		}
	}
}

// Over is the refusal a take reports: past the points, never at them.
func TestOver(t *testing.T) {
	for _, c := range []struct {
		count, points int64
		want          bool
	}{
		{9, 10, false},
		{10, 10, false}, // exactly the points: allowed
		{11, 10, true},
	} {
		if got := Over(c.count, c.points); got != c.want {
			t.Errorf("Over(%d, %d) = %v, want %v", c.count, c.points, got, c.want)
		}
	}
}

// The headers show the first of equals: a later layer replaces it only
// with fewer left.
func TestFewerLeft(t *testing.T) {
	if !FewerLeft(2, 3) || FewerLeft(3, 3) || FewerLeft(4, 3) {
		t.Fatal("FewerLeft(2, 3), FewerLeft(3, 3), FewerLeft(4, 3): want true, false, false")
	}
}

// TestBucketSpend: a spend takes its tokens whatever the burst, from the
// later of the TAT and now, and saturates at BucketHorizon.
func TestBucketSpend(t *testing.T) {
	const interval = 10

	cases := []struct{ tat, now, cost, wantTAT, wantUsed int64 }{
		{0, 100, 3, 130, 3},   // a full bucket: from now
		{150, 100, 3, 180, 8}, // 5 in use: 8 after, past any burst
		{105, 100, 1, 115, 2}, // a part of an interval in use counts whole
		{0, 100, BucketHorizon, BucketHorizon, (BucketHorizon - 100 + interval - 1) / interval},
	}

	for _, c := range cases {
		tat, used := BucketSpend(c.tat, c.now, c.cost, interval)
		if tat != c.wantTAT || used != c.wantUsed {
			t.Errorf("BucketSpend(%d, %d, %d, %d) = %d, %d; want %d, %d", c.tat, c.now, c.cost, interval, tat, used, c.wantTAT, c.wantUsed)
		}
	}
}

// TestWithin: a place maxDelay away is within it, one a nanosecond later
// is not; a place now is within any horizon, 0 included.
func TestWithin(t *testing.T) {
	for _, c := range []struct {
		wait, maxDelay int64
		want           bool
	}{
		{0, 0, true},
		{500, 500, true},
		{501, 500, false},
		{1, 0, false},
		{-1, 0, true},
	} {
		if got := Within(c.wait, c.maxDelay); got != c.want {
			t.Errorf("Within(%d, %d) = %v, want %v", c.wait, c.maxDelay, got, c.want)
		}
	}
}
