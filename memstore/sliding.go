package memstore

import (
	"math"
	"strconv"

	"github.com/tierlimit/tierlimit/limit"
	"github.com/tierlimit/tierlimit/rule"
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
// The Redis script (../redisstore/scripts.go) computes the same thing in Lua, in
// milliseconds.

// slidingCount returns the estimate a request of cost points would bring
// the window to. left is the time left in the current window, d its
// duration, in one unit.
func SlidingCount(prev, count, cost, left, d int64) int64 {
	return count + cost + int64(float64(prev)*float64(left)/float64(d))
}

// slidingWait returns how long after a refusal a request of cost points
// will be allowed, in the unit of left and d (at least 1), as the Redis
// script computes it. count <= points, since only allowed requests are
// counted.
func SlidingWait(prev, count, cost, points, left, d int64) int64 {
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
func (s *WindowStore) slide(t *tally, i int, now int64, l *layer, key string, cost int64) bool {
	w := l.Entries[key]
	if w == nil || w.Expire <= now || w.List != l.List {
		w = s.Restart(now, l, w, key)
	}

	w.Taken = s.Takes

	if w.Reset <= now {
		rotate(w, l)
	}

	left := w.Reset - now
	est := SlidingCount(w.PrevCount, w.Count, cost, left, l.Duration)

	if est > l.Points {
		l.Stats.Refused++
		w.Refused++

		first := !w.Logged
		w.Logged = true
		retry := now + SlidingWait(w.PrevCount, w.Count, cost, l.Points, left, l.Duration)
		return rule.RefuseAs(t, i, l, est, retry, []string{strconv.FormatInt(limit.CeilSeconds(retry), 10)}, first)
	}

	w.Count += cost
	l.Stats.Allowed++
	rule.Allow(t, i, l, est, w.Reset, w.ResetH)

	return false
}

// rotate moves a sliding window whose window ended less than a duration ago
// (else it expired) to the next window, which starts where it ended.
func rotate(w *window, l *layer) {
	w.List.Unlink(w)
	w.PrevCount, w.Count, w.Refused, w.Logged = w.Count, 0, 0, false
	w.Start = w.Reset
	w.Reset = w.Start + l.Duration
	w.Expire = w.Start + l.List.Span
	w.ResetSec = limit.CeilSeconds(w.Reset)
	w.ResetH = []string{strconv.FormatInt(w.ResetSec, 10)}
	l.List.Push(w)
}
