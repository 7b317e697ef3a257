package tierlimit

import (
	"math"
)

// A sliding layer uses the sliding-window counter: windows follow each other
// from a key's first hit, and a request is allowed while
//
//	count + 1 + floor(previous count x time left in the window / duration) <= points
//
// so the previous window's requests weigh by how much of it still overlaps
// the last duration. This removes the fixed window's burst of twice the points
// across a boundary, for one more counter per key. Unlike a fixed window, a
// sliding layer counts only the requests it allows: a client that keeps
// retrying above the limit would otherwise carry its refusals into every
// following window and never be let through again.
//
// The Redis script (redisstore.go) computes the same thing in Lua, in
// milliseconds.

// slidingCount returns the estimate a request would bring the window to.
// left is the time left in the current window, d its duration, in one unit.
func slidingCount(prev, count, left, d int64) int64 {
	return count + 1 + int64(float64(prev)*float64(left)/float64(d))
}

// slidingWait returns how long after a refusal the next request will be
// allowed, in the unit of left and d (at least 1). count <= points, since only
// allowed requests are counted.
func slidingWait(prev, count, points, left, d int64) int64 {
	if count < points {
		// Within this window, once prev x (left - x) / d < points - count;
		// at the latest when it ends.
		x := left - int64(math.Ceil(float64(points-count)*float64(d)/float64(prev))) + 1
		if x < 1 {
			x = 1
		}

		if x > left {
			x = left
		}

		return x
	}

	// In the next window, once count x (d - y) / d < points.
	y := d - int64(math.Ceil(float64(points)*float64(d)/float64(count))) + 1
	if y < 0 {
		y = 0
	}

	return left + y
}

// slide charges one request to a sliding layer l under s.mu and records it in
// t as layers[i]. It reports whether the layer refused.
func (s *windowStore) slide(t *tally, i int, now int64, l *layer, key string) bool {
	t.charged = i + 1

	w := l.entries[key]
	if w == nil || w.expire <= now || w.list != l.list {
		w = s.restart(now, l, w, key)
		l.stats.allowed++
		t.allow(i, l, w.count, w.reset, w.resetH)

		return false
	}

	w.taken = s.takes

	if w.reset <= now {
		// The window ended less than a duration ago (else it expired above):
		// the next one starts where it ended.
		w.list.unlink(w)
		w.before, w.count, w.logged = w.count, 0, false
		w.start = w.reset
		w.reset = w.start + l.duration
		w.expire = w.start + l.list.span
		w.resetH = []string{formatInt(ceilSeconds(w.reset))}
		l.list.push(w)
	}

	left := w.reset - now
	est := slidingCount(w.before, w.count, left, l.duration)

	if est > l.points {
		l.stats.refused++

		first := !w.logged
		w.logged = true
		retry := now + slidingWait(w.before, w.count, l.points, left, l.duration)
		t.refuse(i, est, retry, []string{formatInt(ceilSeconds(retry))}, first)

		return true
	}

	w.count++
	l.stats.allowed++
	t.allow(i, l, est, w.reset, w.resetH)

	return false
}

// allow records that layers[i] let the request through with this count; the
// headers show the layer with the fewest requests left.
func (t *tally) allow(i int, l *layer, count, reset int64, resetH []string) {
	if !t.refused && (t.shown < 0 || l.points-count < t.left) {
		t.shown, t.count, t.reset, t.resetH, t.left = i, count, reset, resetH, l.points-count
	}
}
