// Package answer is what the client receives from the plugin: the
// rate-limit headers' values that the root's header tables do not hold,
// Retry-After, the refusal (its status, content type and body, default or
// from a template) and the refusal of a WebSocket upgrade (a completed
// handshake closed with 1013).
//
// It crosses the package line with plain functions over plain structs
// (../doc.go: functions, not methods) and imports nothing of the plugin: a
// layer's refusal (rule.Refusal) embeds a Policy, which the root passes here.
package answer

import (
	"net/http"
	"strconv"
	"time"

	"github.com/tierlimit/tierlimit/limit"
)

// Policy is what the answer needs of a rule that refuses: the status, the
// content type, and either a bound body template (Body, BindLayer) or the
// default JSON body around the reset time (layer names need no JSON
// escaping). The root's layer embeds it, so that the request path reads its
// fields as the layer's.
type Policy struct {
	Status                 int
	ContentType            []string
	Body                   []BodyPart // nil: the default JSON body
	BodyPrefix, BodySuffix string
}

// SetLargeHeaders formats the values beyond the header table of the rule
// called name; a function of its own so that the common case does not pay
// for its expressions (../doc.go: frames).
func SetLargeHeaders(h http.Header, name string, left, secs int64) {
	rem := strconv.FormatInt(left, 10)
	h["X-Ratelimit-Remaining"] = []string{rem}
	h["Ratelimit"] = []string{`"` + name + `";r=` + rem + ";t=" + strconv.FormatInt(secs, 10)}
}

// MaxSmallInt is the largest number SmallInts holds; an untyped constant,
// since typed expressions such as int64(len(SmallInts)) are evaluated per
// request under Yaegi (../doc.go: frames).
const MaxSmallInt = 3600

// SmallInts are the decimal forms of 0 to MaxSmallInt, for header values.
var SmallInts = func() []string {
	out := make([]string, MaxSmallInt+1)
	for i := range out {
		out[i] = strconv.Itoa(i)
	}

	return out
}()

// RetryAfter is the Retry-After value: whole seconds to the reset, rounded up, at least 1.
func RetryAfter(reset, now int64) string {
	retry := limit.CeilSeconds(reset - now)
	if retry < 1 {
		return "1"
	}

	if retry < int64(len(SmallInts)) {
		return SmallInts[retry]
	}

	return strconv.FormatInt(retry, 10)
}

// Shared header values of a refusal (never modified).
var (
	JSONContentType = []string{"application/json"}
	NoStore         = []string{"no-store"}
)

// Refuse answers a refusal: p's status with Retry-After and the default JSON
// body, or the configured body.
func Refuse(rw http.ResponseWriter, p *Policy, reset, now int64) {
	h := rw.Header()
	h["Retry-After"] = []string{RetryAfter(reset, now)}
	h["Content-Type"] = p.ContentType
	h["Cache-Control"] = NoStore
	rw.WriteHeader(p.Status)

	if p.Body != nil {
		writeTemplate(rw, p, reset, now)
		return
	}

	_, _ = rw.Write([]byte(p.BodyPrefix + time.Unix(limit.CeilSeconds(reset), 0).UTC().Format(time.RFC3339) + p.BodySuffix))
}

// writeTemplate writes a configured body; out of Refuse (../doc.go: frames).
func writeTemplate(rw http.ResponseWriter, p *Policy, reset, now int64) {
	_, _ = rw.Write([]byte(render(p.Body, reset, now)))
}
