package tierlimit

import (
	"net/http"
	"strconv"
	"time"
)

// remaining is what the layer still allows in the window, never negative.
func remaining(l *layer, res result) int64 {
	if res.count >= l.points {
		return 0
	}

	return l.points - res.count
}

// setHeaders writes the X-RateLimit-* headers and the IETF draft fields
// RateLimit-Policy and RateLimit for one layer. Reset is in Unix seconds,
// rounded up so that a client waiting until then finds a new window.
func setHeaders(h http.Header, l *layer, res result, now int64) {
	rem := formatInt(remaining(l, res))

	h.Set("X-RateLimit-Limit", l.limit)
	h.Set("X-RateLimit-Remaining", rem)
	h.Set("X-RateLimit-Reset", formatInt(ceilSeconds(res.reset)))
	h.Set("RateLimit-Policy", l.policy)
	h.Set("RateLimit", `"`+l.name+`";r=`+rem+";t="+formatInt(ceilSeconds(res.reset-now)))
}

// refuse answers 429 with Retry-After (whole seconds, at least 1) and the JSON
// body of the design note.
func refuse(rw http.ResponseWriter, l *layer, res result, now int64) {
	retry := ceilSeconds(res.reset - now)
	if retry < 1 {
		retry = 1
	}

	reset := time.Unix(ceilSeconds(res.reset), 0).UTC().Format(time.RFC3339)

	h := rw.Header()
	h.Set("Retry-After", formatInt(retry))
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	rw.WriteHeader(http.StatusTooManyRequests)

	// Layer names are restricted to characters that need no JSON escaping (validName).
	_, _ = rw.Write([]byte(`{"errors":[{"message":"Hit rate limit","extensions":{"code":"REQUESTS_EXCEEDED","limit":` +
		l.limit + `,"reset":"` + reset + `","layer":"` + l.name + `"}}]}`))
}

// ceilSeconds converts nanoseconds to whole seconds, rounding up.
func ceilSeconds(ns int64) int64 {
	if ns <= 0 {
		return ns / int64(time.Second)
	}

	return (ns + int64(time.Second) - 1) / int64(time.Second)
}

func formatInt(n int64) string {
	return strconv.FormatInt(n, 10)
}
