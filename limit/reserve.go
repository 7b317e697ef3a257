package limit

// A layer with a maxDelay reserves a place that comes within it
// (golang.org/x/time/rate's reserveN and its maxFutureReserve): a request
// that does not fit now is charged at the moment it will, when that moment
// is at most maxDelay away; a cost beyond what the layer holds at once never
// fits, so it has no place to wait for.

// Within reports whether a place wait away (nanoseconds) comes within the
// horizon maxDelay: a wait of maxDelay is within it.
func Within(wait, maxDelay int64) bool {
	return wait <= maxDelay
}
