package tierlimit

import (
	"context"
	"net/http"
	"strings"
	"time"
)

// The fast path serves modeAnonymous, modePrincipal and modeClassify.
// chooseMode guarantees it: the memory store, headers on, no dry run, only
// fixed windows, each keyed by the client IP, the principal or a constant
// (never by a header), no credential cookie or query parameter, no
// connection cap, no exemptions; in modeAnonymous also plans that are never
// empty. So it charges p.memory directly, always sets headers, never charges
// a refused request further, and needs no tally. Requests that a route
// matches are handed to serveGeneral (general.go), which handles everything.
//
// Parts of the decision are written here and in the general path alike, as
// kernels (see doc.go): kernel_test.go fails when the copies drift.

// The handlers of the fast modes: New returns one of them (Plugin.handler),
// so that a request starts on its mode's path without a dispatch frame
// (doc.go: frames). Each is the Plugin under another name, whose ServeHTTP is
// that mode's path; Plugin.ServeHTTP dispatches to the same methods.
type (
	anonymousPath Plugin // modeAnonymous
	principalPath Plugin // modePrincipal
	classifyPath  Plugin // modeClassify
)

// ServeHTTP serves modeClassify, an instance with credential headers or
// routes: a route match goes to serveGeneral, a request with a credential
// header is served with its response watched.
func (c *classifyPath) ServeHTTP(rw http.ResponseWriter, req *http.Request) {
	p := (*Plugin)(c)
	if p.status != nil && serveStatus(p, rw, req) {
		return
	}
	if p.routes != nil && (p.routeMethods == nil || p.routeMethods[req.Method]) && routeMatches(p, req, canonicalPath(req.URL.Path, p.foldPaths)) {
		serveGeneral(p, rw, req)
		return
	}

	credentialed := false
	// kernel credential-header
	for _, h := range p.credHeaders {
		if v := req.Header[h]; len(v) > 0 && strings.TrimSpace(v[0]) != "" {
			credentialed = true
		}
	}
	// end kernel

	switch {
	case credentialed:
		serveCredentialed(p, rw, req)
	case p.userHeader != "":
		(*principalPath)(p).ServeHTTP(rw, req)
	default:
		(*anonymousPath)(p).ServeHTTP(rw, req)
	}
}

// ServeHTTP serves modePrincipal, the instance after ForwardAuth: a request
// with a principal is charged to its tier (and global), keyed by the
// principal, and settles a charge an earlier instance left pending
// (chain.go); one without is served by serveFast.
func (pp *principalPath) ServeHTTP(rw http.ResponseWriter, req *http.Request) {
	p := (*Plugin)(pp)
	if p.status != nil && serveStatus(p, rw, req) {
		return
	}
	principal := principalOf(p, req)
	if principal == "" {
		serveFast(p, rw, req)
		return
	}
	if pd, _ := req.Context().Value(pendingKey).(*pendingIP); pd != nil {
		pd.settled = true
	}
	layers := p.planUser
	if p.serviceHeader != "" && isServiceAccount(p, req) {
		layers = p.planService
	}
	now := p.now().UnixNano()
	s := p.memory
	var shown *layer // the layer that refused, else the one with the fewest left
	var sw *window
	left := int64(0) // requests left in shown; -1: shown refused
	s.mu.Lock()
	s.takes++
	for _, l := range layers {
		key := principal
		if l.keyKind == keyOfConst {
			key = l.constKey
		}
		// kernel fixed-charge
		w := l.entries[key]
		if w != nil && w.reset > now && w.list == l.list {
			w.count++
			w.taken = s.takes
		} else {
			w = s.restart(now, l, w, key)
		}
		// end kernel
		if w.count > l.points {
			shown = l
			sw = w
			left = -1
			break
		}
		l.stats.allowed++
		if shown == nil || l.points-w.count < left {
			shown = l
			sw = w
			left = l.points - w.count
		}
	}
	if left < 0 {
		refuseFast(p, rw, req, shown, sw, "", principal, now)
		return
	}
	if sw == nil {
		s.mu.Unlock()
		p.next.ServeHTTP(rw, req)
		return
	}

	reset := sw.reset
	resetH := sw.resetH
	s.mu.Unlock()
	h := rw.Header()
	// kernel headers
	h["X-Ratelimit-Limit"] = shown.limitHdr
	h["Ratelimit-Policy"] = shown.policyHdr
	h["X-Ratelimit-Reset"] = resetH
	secs := (reset - now + nsPerSecond - 1) / nsPerSecond
	if left < shown.tableLen && secs <= maxSmallInt {
		h["X-Ratelimit-Remaining"] = shown.remainingHdr[left]
		h["Ratelimit"] = []string{shown.ratePrefix[left] + smallInts[secs]}
	} else {
		setLargeHeaders(h, shown, left, secs)
	}
	// end kernel

	p.next.ServeHTTP(rw, req)
}

// serveCredentialed serves a request with a credential header at the edge
// (classifyPath without userHeader): it is charged to global only (planCred
// holds global or nothing), and passed on with its ip charge pending and its
// response watched (chain.go, invalidcred.go).
func serveCredentialed(p *Plugin, rw http.ResponseWriter, req *http.Request) {
	client := ""      // resolved when needed (pendingClient, refuseOther)
	left := int64(-1) // requests left in global; -1: global is off
	if len(p.planCred) > 0 {
		l := p.planCred[0]
		key := l.constKey
		now := p.now().UnixNano()
		s := p.memory
		s.mu.Lock()
		s.takes++
		// kernel fixed-charge
		w := l.entries[key]
		if w != nil && w.reset > now && w.list == l.list {
			w.count++
			w.taken = s.takes
		} else {
			w = s.restart(now, l, w, key)
		}
		// end kernel
		if w.count > l.points {
			refuseFast(p, rw, req, l, w, client, "", now)
			return
		}

		l.stats.allowed++
		left = l.points - w.count
		reset := w.reset
		resetH := w.resetH
		s.mu.Unlock()
		h := rw.Header()
		shown := l
		// kernel headers
		h["X-Ratelimit-Limit"] = shown.limitHdr
		h["Ratelimit-Policy"] = shown.policyHdr
		h["X-Ratelimit-Reset"] = resetH
		secs := (reset - now + nsPerSecond - 1) / nsPerSecond
		if left < shown.tableLen && secs <= maxSmallInt {
			h["X-Ratelimit-Remaining"] = shown.remainingHdr[left]
			h["Ratelimit"] = []string{shown.ratePrefix[left] + smallInts[secs]}
		} else {
			setLargeHeaders(h, shown, left, secs)
		}
		// end kernel
	}

	// Converted to the interface first (doc.go: wrappers).
	var out http.ResponseWriter = rw
	if p.planInvalid != nil {
		// kernel pass-credentialed
		pd := &pendingIP{edge: p, req: req, client: client}
		req = req.WithContext(context.WithValue(req.Context(), pendingKey, pd))
		if p.invalidCode != nil {
			out = &credentialWriter{rw: rw, req: req, p: p, prevLeft: left, pending: pd}
		}
		// end kernel
	}

	p.next.ServeHTTP(out, req)
}

// serveFast serves a request without a principal at the instance after
// ForwardAuth: it settles a charge an earlier instance left pending
// (afterAuthPlan) or is charged to ip or assets. It calls clientKey and
// setHeaders where the paths above write their kernels out, to stay short.
func serveFast(p *Plugin, rw http.ResponseWriter, req *http.Request) {
	layers, ok := afterAuthPlan(p, rw, req, "")
	if !ok {
		return
	}

	client := clientKey(p.ips, req)
	now := p.now().UnixNano()
	s := p.memory
	var shown *layer // the layer that refused, else the one with the fewest left
	var sw *window
	left := int64(0) // requests left in shown; -1: shown refused
	s.mu.Lock()
	s.takes++
	for _, l := range layers {
		key := client
		if l.keyKind == keyOfConst {
			key = l.constKey
		}
		// kernel fixed-charge
		w := l.entries[key]
		if w != nil && w.reset > now && w.list == l.list {
			w.count++
			w.taken = s.takes
		} else {
			w = s.restart(now, l, w, key)
		}
		// end kernel
		if w.count > l.points {
			shown = l
			sw = w
			left = -1
			break
		}

		l.stats.allowed++
		if shown == nil || l.points-w.count < left {
			shown = l
			sw = w
			left = l.points - w.count
		}
	}

	if left < 0 {
		refuseFast(p, rw, req, shown, sw, client, "", now)
		return
	}

	if sw == nil {
		s.mu.Unlock()
		p.next.ServeHTTP(rw, req)
		return
	}

	reset := sw.reset
	resetH := sw.resetH
	s.mu.Unlock()
	setHeaders(rw.Header(), shown, left, reset, resetH, now)
	p.next.ServeHTTP(rw, req)
}

// ServeHTTP serves every request of modeAnonymous, and the requests without
// a credential header of modeClassify without userHeader: the principal and
// credentials are not read, and its frame holds none of their expressions
// (doc.go: frames). Its plans are never empty (chooseMode), so some layer
// always shows its headers.
func (ap *anonymousPath) ServeHTTP(rw http.ResponseWriter, req *http.Request) {
	p := (*Plugin)(ap)
	if p.status != nil && serveStatus(p, rw, req) {
		return
	}
	client := ""
	// kernel client-ip (p.ips as r)
	if req.Header["X-Forwarded-For"] == nil {
		i := strings.LastIndexByte(req.RemoteAddr, ':')
		if i > 0 && req.RemoteAddr[0] != '[' {
			client = req.RemoteAddr[:i]
		}
	}
	if client == "" {
		client = resolve(p.ips, req)
	}
	// end kernel
	layers := p.planIP
	if p.assetHint != nil && p.assetHint.MatchString(req.URL.Path) && isAsset(p, req) {
		layers = p.planAssets
	}

	now := p.now().UnixNano()
	s := p.memory
	var shown *layer // the layer that refused, else the one with the fewest left
	var sw *window
	left := int64(0) // requests left in shown; -1: shown refused
	s.mu.Lock()
	s.takes++
	for _, l := range layers {
		key := client
		if l.keyKind == keyOfConst {
			key = l.constKey
		}
		// kernel fixed-charge
		w := l.entries[key]
		if w != nil && w.reset > now && w.list == l.list {
			w.count++
			w.taken = s.takes
		} else {
			w = s.restart(now, l, w, key)
		}
		// end kernel
		if w.count > l.points {
			shown = l
			sw = w
			left = -1
			break
		}
		l.stats.allowed++
		if shown == nil || l.points-w.count < left {
			shown = l
			sw = w
			left = l.points - w.count
		}
	}

	if left < 0 {
		refuseFast(p, rw, req, shown, sw, client, "", now)
		return
	}
	reset := sw.reset
	resetH := sw.resetH
	s.mu.Unlock()
	h := rw.Header()
	// kernel headers
	h["X-Ratelimit-Limit"] = shown.limitHdr
	h["Ratelimit-Policy"] = shown.policyHdr
	h["X-Ratelimit-Reset"] = resetH
	secs := (reset - now + nsPerSecond - 1) / nsPerSecond
	if left < shown.tableLen && secs <= maxSmallInt {
		h["X-Ratelimit-Remaining"] = shown.remainingHdr[left]
		h["Ratelimit"] = []string{shown.ratePrefix[left] + smallInts[secs]}
	} else {
		setLargeHeaders(h, shown, left, secs)
	}
	// end kernel

	p.next.ServeHTTP(rw, req)
}

// refuseFast answers a request that layer l refused in window w on the fast
// path; it is called with the memory store locked and unlocks it. A refusal
// proxies nothing and, with the default body, reuses what an earlier refusal
// of the layer computed (refusalCache): the body and the headers depend only
// on the layer, the reset second and the seconds to the reset.
func refuseFast(p *Plugin, rw http.ResponseWriter, req *http.Request, l *layer, w *window, client, principal string, now int64) {
	l.stats.refused++

	if l.body != nil || req.Header["Upgrade"] != nil || !w.logged {
		refuseOther(p, rw, req, l, w, client, principal, now)
		return
	}

	c := &l.cache
	secs := (w.reset - now + nsPerSecond - 1) / nsPerSecond
	if c.resetH != w.resetH[0] || c.secs != secs {
		c.set(l, w.resetH[0], w.reset, secs)
	}

	values := c.values
	body := c.body

	p.memory.mu.Unlock()

	h := rw.Header()
	// kernel cached-refusal
	for i, v := range values {
		h[refusalHeaders[i]] = v
	}
	rw.WriteHeader(l.status)
	_, _ = rw.Write(body)
	// end kernel
}

// refusalHeaders are the names of refusalCache.values.
var refusalHeaders = []string{
	"X-Ratelimit-Limit", "Ratelimit-Policy", "X-Ratelimit-Reset", "X-Ratelimit-Remaining",
	"Ratelimit", "Retry-After", "Content-Type", "Cache-Control",
}

// set caches the refusal of a window that resets at reset (resetH
// formatted), secs seconds from now. The slices handed out before are left
// as they are: requests that read them may still be writing them.
func (c *refusalCache) set(l *layer, resetH string, reset, secs int64) {
	if c.resetH != resetH {
		c.resetH = resetH
		c.resetSec = ceilSeconds(reset)
		c.body = []byte(l.bodyPrefix + time.Unix(ceilSeconds(reset), 0).UTC().Format(time.RFC3339) + l.bodySuffix)
	}

	c.secs = secs
	c.values = [][]string{
		l.limitHdr, l.policyHdr, {resetH}, l.remainingHdr[0],
		{`"` + l.name + `";r=0;t=` + formatInt(secs)}, {formatInt(secs)}, l.contentType, noStore,
	}
}

// refuseOther is refuseFast for a configured body, a WebSocket upgrade, or
// the window's first refusal, which is reported.
func refuseOther(p *Plugin, rw http.ResponseWriter, req *http.Request, l *layer, w *window, client, principal string, now int64) {
	count, reset, resetH := w.count, w.reset, w.resetH
	first := !w.logged
	w.logged = true

	p.memory.mu.Unlock()

	if first {
		if client == "" {
			client = clientKey(p.ips, req)
		}

		p.events.refused(l.name, l.keyFor(client, principal, nil), client)
	}

	setHeaders(rw.Header(), l, 0, reset, resetH, now)
	reject(p, rw, req, l, count, reset, now)
}
