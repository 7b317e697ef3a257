package limit

// A fixed window holds the points charged since it started; a request of
// cost points fits while they stay within the layer's points. A token
// bucket's tokens in use fit a take the same way (BucketTake).

// Fits reports whether a request of cost points fits a fixed window that
// holds count of points: count + cost <= points.
func Fits(count, cost, points int64) bool {
	return count+cost <= points
}

// Aligned returns the start and end of the window of duration d that holds
// now, aligned to the Unix epoch: processes that compute it for the same
// time agree on the window without sharing any state.
func Aligned(now, d int64) (int64, int64) {
	start := now - now%d

	return start, start + d
}

// CeilMillis converts nanoseconds to whole milliseconds, rounding up: what
// is left of a window, in the unit of Redis's TTLs.
func CeilMillis(ns int64) int64 {
	return (ns + nsPerMillisecond - 1) / nsPerMillisecond
}

const nsPerMillisecond = 1000000

// Full reports whether a fixed window that holds count of its points has
// no room for a request of cost 1, !Fits(count, 1, points): the check of
// the fast paths, which charge 1. It is a concurrency layer's check too,
// with the slots held and the layer's slots: a request holds one slot
// whatever its cost, so a slot fits while held < slots.
func Full(count, points int64) bool {
	return count >= points
}

// Left is what a window that holds count of its points has left: the
// remaining the headers show, and what tells which layer they show (the
// one with the least left).
func Left(count, points int64) int64 {
	return points - count
}

// Held is what a window with left of its points left holds: Left's
// inverse, what a Redis reply that states left leaves in memory's mirror
// of the window.
func Held(left, points int64) int64 {
	return points - left
}

// Over reports whether a count that a take reports is past the points: a
// refused take reports the count it would have reached (count + cost where
// Fits is false, a sliding window's estimate, a bucket's tokens in use), an
// allowed one at most the points. A store reads a refusal from it.
func Over(count, points int64) bool {
	return count > points
}

// FewerLeft reports whether a layer with left requests left is more
// restrictive than the one the headers show, which has shownLeft: the
// headers show the layer with the fewest left, the first of equals.
func FewerLeft(left, shownLeft int64) bool {
	return left < shownLeft
}
