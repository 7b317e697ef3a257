package tierlimit

import (
	"math"

	"github.com/tierlimit/tierlimit/limit"
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

// slidingCount returns the estimate a request of cost points would bring
// the window to. left is the time left in the current window, d its
// duration, in one unit.
func slidingCount(prev, count, cost, left, d int64) int64 {
	return count + cost + int64(float64(prev)*float64(left)/float64(d))
}

// slidingWait returns how long after a refusal a request of cost points
// will be allowed, in the unit of left and d (at least 1), as the Redis
// script computes it. count <= points, since only allowed requests are
// counted.
func slidingWait(prev, count, cost, points, left, d int64) int64 {
	if count+cost <= points {
		// Within this window, once count + cost + prev x (left - x) / d <=
		// points; at the latest when it ends.
		x := left - int64(math.Ceil(float64(points-count-cost+1)*float64(d)/float64(prev))) + 1
		if x < 1 {
			x = 1
		}

		if x > left {
			x = left
		}

		return x
	}

	// In the next window, once cost + count x (d - y) / d <= points (a
	// cost above the points never fits: a whole window).
	y := d
	if count > 0 && cost <= points {
		y = d - int64(math.Ceil(float64(points-cost+1)*float64(d)/float64(count))) + 1
	}

	if y < 0 {
		y = 0
	}

	return left + y
}

// slide charges cost points to a sliding layer l under s.mu and records it
// in t as layers[i]. It reports whether the layer refused, which charges
// nothing, in dry run too: a sliding window counts only what it allows.
func (s *windowStore) slide(t *tally, i int, now int64, l *layer, key string, cost int64) bool {
	w := l.entries[key]
	if w == nil || w.expire <= now || w.list != l.list {
		w = s.restart(now, l, w, key)
	}

	w.taken = s.takes

	if w.reset <= now {
		rotate(w, l)
	}

	left := w.reset - now
	est := slidingCount(w.prevCount, w.count, cost, left, l.duration)

	if est > l.points {
		l.stats.refused++
		w.refused++

		first := !w.logged
		w.logged = true
		retry := now + slidingWait(w.prevCount, w.count, cost, l.points, left, l.duration)
		return t.refuseAs(i, l, est, retry, []string{formatInt(limit.CeilSeconds(retry))}, first)
	}

	w.count += cost
	l.stats.allowed++
	t.allow(i, l, est, w.reset, w.resetH)

	return false
}

// rotate moves a sliding window whose window ended less than a duration ago
// (else it expired) to the next window, which starts where it ended.
func rotate(w *window, l *layer) {
	w.list.unlink(w)
	w.prevCount, w.count, w.refused, w.logged = w.count, 0, 0, false
	w.start = w.reset
	w.reset = w.start + l.duration
	w.expire = w.start + l.list.span
	w.resetSec = limit.CeilSeconds(w.reset)
	w.resetH = []string{formatInt(w.resetSec)}
	l.list.push(w)
}

// allow records that layers[i] let the request through with this count; the
// headers show the layer with the fewest requests left, never a quiet one
// (layer.quiet). One value is assigned at a time (doc.go: frames).
func (t *tally) allow(i int, l *layer, count, reset int64, resetH []string) {
	left := l.points - count
	if t.refused || l.quiet || t.shown >= 0 && left >= t.left {
		return
	}

	t.shown = i
	t.count = count
	t.reset = reset
	t.resetH = resetH
	t.left = left
}
