package tierlimit

import (
	"net/http"
	"strconv"
	"time"
)

// setLargeHeaders formats the values beyond the header table; a function of
// its own so that the common case does not pay for its expressions (doc.go).
func setLargeHeaders(h http.Header, l *layer, left, secs int64) {
	rem := formatInt(left)
	h["X-Ratelimit-Remaining"] = []string{rem}
	h["Ratelimit"] = []string{`"` + l.name + `";r=` + rem + ";t=" + formatInt(secs)}
}

// Constants of the header arithmetic: typed expressions such as
// int64(time.Second) or int64(len(smallInts)) are evaluated per request under
// Yaegi (doc.go: frames).
const (
	nsPerSecond = 1000000000
	maxSmallInt = 3600
)

// smallInts are the decimal forms of 0 to maxSmallInt, for header values.
var smallInts = func() []string {
	out := make([]string, maxSmallInt+1)
	for i := range out {
		out[i] = strconv.Itoa(i)
	}

	return out
}()

// retryAfter is the Retry-After value: whole seconds to the reset, rounded up, at least 1.
func retryAfter(reset, now int64) string {
	retry := ceilSeconds(reset - now)
	if retry < 1 {
		return "1"
	}

	if retry < int64(len(smallInts)) {
		return smallInts[retry]
	}

	return strconv.FormatInt(retry, 10)
}

// Shared header values of a refusal (never modified).
var (
	jsonContentType = []string{"application/json"}
	noStore         = []string{"no-store"}
)

// refuse answers a refusal: 429 (or response.statusCode) with Retry-After and
// the default JSON body, or the configured body.
func refuse(rw http.ResponseWriter, l *layer, count, reset, now int64) {
	h := rw.Header()
	h["Retry-After"] = []string{retryAfter(reset, now)}
	h["Content-Type"] = l.contentType
	h["Cache-Control"] = noStore
	rw.WriteHeader(l.status)

	if l.body != nil {
		writeTemplate(rw, l, reset, now)
		return
	}

	_, _ = rw.Write([]byte(l.bodyPrefix + time.Unix(ceilSeconds(reset), 0).UTC().Format(time.RFC3339) + l.bodySuffix))
}

// writeTemplate writes a configured body; out of refuse (doc.go: frames).
func writeTemplate(rw http.ResponseWriter, l *layer, reset, now int64) {
	_, _ = rw.Write([]byte(render(l.body, reset, now)))
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
