package limit

// Algorithm is how a layer counts, chosen once from the configuration
// (rule.NewLayer): every store, the answer and the status page read it to
// choose their arithmetic. What a layer's points are depends on it:
//
//   - Fixed: a window's points, the most it holds (window.go). A calendar
//     window is a fixed window whose period is a calendar's (period.go).
//   - Sliding: a window's points, weighed with the window before
//     (sliding.go).
//   - TokenBucket: the bucket's burst, the tokens it holds when full; its
//     rate is apart, one token per interval (bucket.go).
//   - Concurrency: the slots, requests in flight at once per key; a
//     request holds one whatever its cost, so it fits while fewer than the
//     slots are held (Full).
//
// A layer keeps it as an int too, which the request path compares
// (rule.Limits.Alg: comparing an Algorithm costs an allocation under
// Yaegi, ../doc.go: frames).
type Algorithm int

// The algorithms; the zero value is the fixed window, the default.
const (
	Fixed Algorithm = iota
	Sliding
	TokenBucket
	Concurrency
)

// Capacity is what a layer of algorithm a holds when it is empty: its
// points, a token bucket's burst.
func Capacity(a Algorithm, points, burst int64) int64 {
	if a == TokenBucket {
		return burst
	}

	return points
}

// Gradual reports whether a layer of algorithm a frees its points little
// by little, so that a larger cost fits later than a smaller one: a
// sliding window, a token bucket. A fixed window frees them all at its
// reset; a concurrency slot when its request ends.
//
// A switch, not comparisons (../doc.go: frames): the Redis store asks on
// the request path.
func Gradual(a Algorithm) bool {
	switch a {
	case Sliding, TokenBucket:
		return true
	}

	return false
}
