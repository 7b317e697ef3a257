package tierlimit

import (
	"net/http"
	"strconv"
	"time"
)

// setHeaders writes the X-RateLimit-* headers and the IETF draft fields
// RateLimit-Policy and RateLimit for the layer a tally shows. Reset is in Unix
// seconds, rounded up so that a client waiting until then finds a new window.
//
// Under Yaegi every expression costs, so the values are precomputed where they
// can be (per layer, per number of requests left, per window) and the map is
// written directly, with the canonical names. The slices are shared by every
// response: http.Header's Add and Set replace a value rather than write into it.
func setHeaders(h http.Header, l *layer, t *tally, now int64) {
	h["X-Ratelimit-Limit"] = l.limitHdr
	h["Ratelimit-Policy"] = l.policyHdr
	h["X-Ratelimit-Reset"] = t.resetH

	secs := (t.reset - now + int64(time.Second) - 1) / int64(time.Second)

	if t.left < int64(len(l.remainingHdr)) && secs < int64(len(smallInts)) {
		h["X-Ratelimit-Remaining"] = l.remainingHdr[t.left]
		h["Ratelimit"] = []string{l.ratePrefix[t.left] + smallInts[secs]}

		return
	}

	setLargeHeaders(h, l, t.left, secs)
}

// setLargeHeaders formats the values beyond setHeaders' tables. A function of
// its own, so that the common case does not pay for its expressions.
func setLargeHeaders(h http.Header, l *layer, left, secs int64) {
	rem := formatInt(left)
	h["X-Ratelimit-Remaining"] = []string{rem}
	h["Ratelimit"] = []string{`"` + l.name + `";r=` + rem + ";t=" + formatInt(secs)}
}

// smallInts are the decimal forms of 0 to 3600, for header values.
var smallInts = func() []string {
	out := make([]string, 3601)
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
// the JSON body of the design note, or the configured body.
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

// writeTemplate writes a configured body; out of refuse, whose every
// expression costs under Yaegi even when not taken.
func writeTemplate(rw http.ResponseWriter, l *layer, reset, now int64) {
	_, _ = rw.Write([]byte(render(l.body, reset, now)))
}

// setResponse gives every layer the configured refusal.
func (p *Plugin) setResponse() {
	rc := p.cfg.response

	contentType := jsonContentType
	if rc.ContentType != jsonContentType[0] {
		contentType = []string{rc.ContentType}
	}

	all := p.layers
	if p.wsLayer != nil {
		all = append(all[:len(all):len(all)], p.wsLayer)
	}

	for _, l := range all {
		l.status, l.contentType = rc.StatusCode, contentType
		if p.cfg.responseBody != nil {
			l.body = bindLayer(p.cfg.responseBody, l.name, l.limit)
		}
	}
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
