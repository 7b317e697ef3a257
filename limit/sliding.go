package limit

import "math"

// A sliding window counter: windows follow each other from a key's first
// hit, and a request of cost points is allowed while
//
//	count + cost + floor(prev x toEnd / d) <= points
//
// with count the points allowed in the current window, prev those of the
// window before, toEnd the time to the current window's end and d the
// window's duration: the previous window's points weigh by how much of it
// still overlaps the last duration. Only allowed points are counted, so
// count <= points. The Redis script computes the same in milliseconds.

// SlidingCount returns the estimate a request of cost points would bring a
// sliding window to: count + cost + floor(prev x toEnd / d). toEnd is the
// time to the current window's end, d its duration, in one unit.
func SlidingCount(prev, count, cost, toEnd, d int64) int64 {
	return count + cost + int64(float64(prev)*float64(toEnd)/float64(d))
}

// SlidingWait returns how long after a refusal a request of cost points
// will be allowed, in the unit of toEnd and d (at least 1), as the Redis
// script computes it. count <= points, since only allowed requests are
// counted.
func SlidingWait(prev, count, cost, points, toEnd, d int64) int64 {
	if count+cost <= points {
		// Within this window, once count + cost + prev x (toEnd - x) / d <=
		// points; at the latest when it ends.
		x := toEnd - int64(math.Ceil(float64(points-count-cost+1)*float64(d)/float64(prev))) + 1
		if x < 1 {
			x = 1
		}

		if x > toEnd {
			x = toEnd
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

	return toEnd + y
}

// SlidingAt returns a sliding window's previous count, count and end at
// now, from those it was last written with: unchanged before its end; one
// window on (its count becomes the previous one) within a duration d after
// it; and a new window from now, empty, once the window after it ended too.
func SlidingAt(prev, count, end, now, d int64) (int64, int64, int64) {
	if now < end {
		return prev, count, end
	}

	if now < end+d {
		return count, 0, end + d
	}

	return 0, 0, now + d
}
