package tierlimit

import (
	"net/http"
	"time"

	"github.com/tierlimit/tierlimit/limit"

	"github.com/tierlimit/tierlimit/answer"
	"github.com/tierlimit/tierlimit/request"
)

// The fast path serves modeAnonymous, modePrincipal(Plans) and modeClassify.
// chooseMode guarantees it: the memory store, headers on, no dry run, only
// fixed windows, each keyed by the client IP, the principal or a constant
// (never by a header), no credential cookie or query parameter, no
// connection cap, no exemptions; in modeAnonymous also plans that are never
// empty. So it charges p.memory directly, always sets headers, and needs no
// tally. Requests that a route matches are handed to serveGeneral
// (general.go), which handles everything.
//
// The paths themselves are in paths_gen.go, generated from paths.tmpl; this
// file holds what they call on a refusal.

// The handlers of the fast modes: New returns one of them (Plugin.handler),
// so that a request starts on its mode's path without a dispatch frame
// (doc.go: frames). Each is the Plugin under another name, whose ServeHTTP is
// that mode's path; Plugin.ServeHTTP dispatches to the same methods.
type (
	anonymousPath      Plugin // modeAnonymous
	principalPath      Plugin // modePrincipal
	principalPlansPath Plugin // modePrincipalPlans
	classifyPath       Plugin // modeClassify
)

// refusalHeaders are the names of refusalCache.values.
var refusalHeaders = []string{
	"X-Ratelimit-Limit", "Ratelimit-Policy", "X-Ratelimit-Reset", "X-Ratelimit-Remaining",
	"Ratelimit", "Retry-After", "Content-Type", "Cache-Control",
}

// cacheWindowRefusal is cacheRefusal for the window w of l; out of
// refuseFast, whose frame would hold its arguments (doc.go: frames).
func cacheWindowRefusal(l *layer, w *window, secs int64) {
	cacheRefusal(l, w.ResetH[0], w.Reset, secs)
}

// cacheRefusal caches the refusal of layer l for a window that resets at
// reset (resetH formatted), secs seconds from now. The slices handed out
// before are left as they are: requests that read them may still be writing
// them. A function, not a method (doc.go: functions, not methods).
func cacheRefusal(l *layer, resetH string, reset, secs int64) {
	c := &l.Cache
	if c.ResetH != resetH {
		c.ResetH = resetH
		c.ResetSec = limit.CeilSeconds(reset)
		c.Body = []byte(l.BodyPrefix + time.Unix(limit.CeilSeconds(reset), 0).UTC().Format(time.RFC3339) + l.BodySuffix)
	}

	c.Secs = secs
	c.Values = [][]string{
		l.LimitHdr, l.PolicyHdr, {resetH}, l.RemainingHdr[0],
		{`"` + l.Name + `";r=0;t=` + formatInt(secs)}, {formatInt(secs)}, l.ContentType, answer.NoStore,
	}
}

// refuseOther is refuseFast for a configured body, a WebSocket upgrade, or
// the window's first refusal, which is reported.
func refuseOther(p *Plugin, rw http.ResponseWriter, req *http.Request, l *layer, w *window, now int64) {
	reset, resetH := w.Reset, w.ResetH
	first := !w.Logged
	w.Logged = true

	p.memory.Mu.Unlock()

	// The event's keys are found again here, off the common refusal.
	if first {
		client := clientKey(p.ips, req)
		p.events.Refused(l.Name, keyFor(l, client, request.PrincipalOf(p.UserHeader, req), nil), client, l.DryRun)
	}

	setHeaders(rw.Header(), l, 0, reset, resetH, now)
	reject(p, rw, req, l, reset, now)
}
