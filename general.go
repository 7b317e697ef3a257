package tierlimit

import (
	"context"
	"net/http"
	"time"

	"github.com/tierlimit/tierlimit/answer"
	"github.com/tierlimit/tierlimit/request"
	"github.com/tierlimit/tierlimit/rule"
)

// The general path serves modeGeneral, and the route matches of
// modeClassify. chooseMode guarantees it nothing beyond an active
// instance (some layer or the connection cap on): it handles either store,
// dry run, headers off, sliding and header-keyed layers, credentials in
// headers, cookies or query parameters, routes, exemptions and the WebSocket
// connection cap, through take (stores.go) and a tally.

// generalPlan is the layers a request of the general path is charged to,
// and whether it carries a credential whose ip charge is left pending; the
// matching routes (unless the caller matched them: hits.matched), their
// cost and countStatus routes go to hits. ok is false when
// a charge left pending by an earlier instance refused the request, which
// has then been answered (afterAuthPlan).
func generalPlan(p *Plugin, rw http.ResponseWriter, req *http.Request, principal string, hits *routeHits) (layers []*rule.Layer, credentialed, ok bool) {
	layers = p.planIP

	switch {
	case p.UserHeader != "":
		if layers, ok = afterAuthPlan(p, rw, req, principal); !ok {
			return nil, false, false
		}
	case len(p.CredentialHeaders)+len(p.CredentialCookies)+len(p.CredentialParams) > 0 && hasCredential(p, req):
		layers = p.planCred
		credentialed = true
	case p.assetHint != nil && p.assetHint.MatchString(req.URL.Path) && isAsset(p, req):
		layers = p.planAssets
	}

	if p.routes != nil {
		hits.principal = principal
		layers = withRoutes(p, layers, req, hits)
	}

	return layers, credentialed, true
}

// verdict is decide after the charge c: it reports first refusals, sets the
// headers and answers a refusal.
func verdict(p *Plugin, rw http.ResponseWriter, req *http.Request, t *rule.Tally, c *rule.Charge) (bool, int64) {
	// A refusal always shows a layer (tally.refuse); a quiet dry-run
	// layer's does not (tally.allow), and is reported here.
	if t.Shown < 0 {
		if t.Firsts != 0 {
			report(p, c, t.Firsts)
		}

		return true, -1
	}

	if p.headers {
		setHeaders(rw.Header(), c.Layers[t.Shown], t.Left, t.Reset, t.ResetH, c.Now)
	}

	// After the headers, which a month layer's mark corrects (stores.month);
	// a request whose take reserved a place waits for it there (waitBit).
	if t.Firsts != 0 {
		reportWaiting(p, rw, req, t, c)
	}

	if !t.Refused || p.dryRun {
		return true, t.Left
	}

	reject(p, rw, req, c.Layers[t.Shown], t.Reset, c.Now)

	return false, 0
}

// serveUpgrade passes on a WebSocket upgrade under the per-IP connection cap.
// out is what next gets (rw, or a watchWriter around it); refusals are
// written to rw itself, which can be hijacked.
func serveUpgrade(p *Plugin, out, rw http.ResponseWriter, req *http.Request, client string) {
	ok, first := p.ws.acquire(client)
	if first {
		p.events.Refused(p.wsLayer.Name, client, client, p.dryRun)
	}

	if !ok && !p.dryRun {
		now := p.now().UnixNano()
		reject(p, rw, req, p.wsLayer, now+p.wsLayer.Duration, now)

		return
	}

	if ok {
		// Held while the proxy serves the connection, which is its whole life.
		defer p.ws.release(client)
	}

	p.next.ServeHTTP(out, req)
}

// reportTally is report for a tally of charge c whose headers rw shows
// (reportWaiting) where no request waits: a countStatus route's charge
// after the response (../after.go).
func reportTally(p *Plugin, rw http.ResponseWriter, t *rule.Tally, c *rule.Charge) {
	reportWaiting(p, rw, nil, t, c)
}

// reportWaiting is report for a tally of charge c whose headers rw shows, and
// writes a month layer's policy when take marked it (stores.month), and the
// RateLimit items of a tally that has them (itemsBit, items.go); a request
// req whose take reserved a place (waitBit) waits for it here, in a frame
// that only the requests with a mark have.
func reportWaiting(p *Plugin, rw http.ResponseWriter, req *http.Request, t *rule.Tally, c *rule.Charge) {
	if t.Firsts&monthPolicyBit != 0 {
		rule.SetMonthPolicy(rw.Header(), c.Layers[t.Shown], c.Now)
	}

	if t.Firsts&itemsBit != 0 {
		setItems(p, rw.Header(), t, c)
	}

	if t.Firsts&^markBits != 0 {
		reportOrWait(p, rw, req, t, c)
	}
}

// reportOrWait is report of t's first refusals, for a tally that may mark a
// wait (waitBit), which it waits for first (waitForPlace).
func reportOrWait(p *Plugin, rw http.ResponseWriter, req *http.Request, t *rule.Tally, c *rule.Charge) {
	if t.Firsts&waitBit != 0 && req != nil {
		waitForPlace(p, rw, req, t, c)
	}

	if t.Firsts&^markBits != 0 {
		report(p, c, t.Firsts)
	}
}

// report writes an event for each of c's layers whose refusal is the first
// of its window (the bits of firsts below itemsBit).
func report(p *Plugin, c *rule.Charge, firsts uint64) {
	for i, l := range c.Layers {
		if i < 63 && firsts&(uint64(1)<<uint(i)) != 0 && l.Alg == algConcurrency {
			p.events.RefusedInFlight(l.Name, c.Keys[i], c.Client, l.DryRun, l.Capacity)
		} else if i < 63 && firsts&(uint64(1)<<uint(i)) != 0 {
			p.events.Refused(l.Name, c.Keys[i], c.Client, l.DryRun)
		}
	}
}

// reject answers a refused request: a 429, or for a WebSocket upgrade a
// completed handshake closed with 1013.
func reject(p *Plugin, rw http.ResponseWriter, req *http.Request, l *rule.Layer, reset, now int64) {
	if req.Header["Upgrade"] == nil || !request.IsUpgrade(req) {
		answer.Refuse(rw, &l.Policy, reset, now)
		return
	}

	plain := func() { answer.Refuse(rw, &l.Policy, reset, now) }

	if l == p.wsLayer {
		answer.RefuseUpgrade(rw, req, "too many connections from this address", plain)
		return
	}

	retry := answer.RetryAfter(reset, now)
	rw.Header().Set("Retry-After", retry)
	answer.RefuseUpgrade(rw, req, "rate limit "+l.Name+": retry in "+retry+"s", plain)
}

// principalPlan is the plan of a request with a principal: service, the
// plan its plan header names, or user.
func principalPlan(p *Plugin, req *http.Request) []*rule.Layer {
	if request.IsServiceAccount(p.ServiceHeader, req) {
		return p.planService
	}

	if p.planHeader != "" {
		return namedPlanOf(p, req)
	}

	return p.planUser
}

// serveRouted serves a request of the classify path that matches a route,
// on the path routedPaths chose, and reports whether it did.
func serveRouted(p *Plugin, rw http.ResponseWriter, req *http.Request) bool {
	matched := matchRoutes(p, req, request.CanonicalPath(req.URL.Path, p.foldPaths))
	if matched == nil {
		return false
	}

	if p.routedFast {
		serveRoutedFast(p, rw, req, matched)
	} else if p.countedFast {
		serveCountedFast(p, rw, req, matched)
	} else {
		serveGeneral(p, rw, req, matched)
	}

	return true
}

// matchRoutes returns the routes that the request, whose canonical path is
// path, matches: nil when none (it allocates only on a match). An exact
// path matches with or without a trailing slash; a route that compares
// another form of the path (routeForm) is matched in that form. One function for every route, the match written out: a call
// per route would cost its frame (doc.go: frames).
func matchRoutes(p *Plugin, req *http.Request, path string) []*route {
	var out []*route

	for _, rt := range p.routes {
		if rt.methods != nil && !rt.methods[req.Method] {
			continue
		}

		form := path
		if rt.otherForm {
			form = routeForm(rt, req, path)
		}

		if rt.exact[form] || request.HasAnyPrefix(form, rt.prefixes) {
			out = append(out, rt)
		}
	}

	return out
}

// withRoutes appends the layers of the routes the request matches
// (hits.matched, else matched here) to the plan, and writes to hits the
// largest of their costs (the request's cost in every layer) and those
// that count only listed statuses.
func withRoutes(p *Plugin, layers []*rule.Layer, req *http.Request, hits *routeHits) []*rule.Layer {
	if hits.matched == nil {
		hits.matched = matchRoutes(p, req, request.CanonicalPath(req.URL.Path, p.foldPaths))
	}

	if hits.matched == nil {
		return layers
	}

	out := make([]*rule.Layer, len(layers), len(layers)+len(hits.matched))
	copy(out, layers)

	for _, rt := range hits.matched {
		if rt.plans != nil && hits.principal != "" {
			out = withRoutePlan(p, out, rt, req, hits)
			continue
		}

		if rt.cost > hits.cost {
			hits.cost = rt.cost
		}

		if rt.costFrom != nil {
			hits.metered = append(hits.metered, rt)
			continue
		}

		out = append(out, rt.layer)

		if rt.countStatus != nil {
			hits.counted = append(hits.counted, rt)
		}
	}

	// The costFrom routes' layers last: takeReserving takes the others
	// first, as the charge's prefix.
	for _, rt := range hits.metered {
		out = append(out, rt.layer)
	}

	return out
}

// withRoutePlan is withRoutes for a matched route with plans
// (route.plans): it charges, as withRoutes charges a route (written out
// there: doc.go: frames), the route's form for a principal whose plan
// header names one of its plans, else the route. A plan with no limit on
// the route (points 0: routePlans) adds the route's cost to the request
// and no layer.
func withRoutePlan(p *Plugin, out []*rule.Layer, rt *route, req *http.Request, hits *routeHits) []*rule.Layer {
	if v := req.Header[p.planHeader]; len(v) > 0 && rt.plans[v[0]] != nil {
		rt = rt.plans[v[0]]
	}

	if rt.cost > hits.cost {
		hits.cost = rt.cost
	}

	switch {
	case rt.layer == nil:
	case rt.costFrom != nil:
		hits.metered = append(hits.metered, rt)
	default:
		out = append(out, rt.layer)
		if rt.countStatus != nil {
			hits.counted = append(hits.counted, rt)
		}
	}

	return out
}

// maxDelay: a layer with a maxDelay does not refuse a request whose place
// comes within it. The store reserves that place at once, as
// golang.org/x/time/rate's Reserve does (paths.tmpl: delay), so that the
// requests that wait queue in the order they came instead of racing for the
// moment the layer frees; the take reports the longest wait of its layers
// (tally.Wait, rule.WaitBit), which verdict waits for (waitForPlace). A
// request that would wait longer is refused as before, reserving nothing.

// waitBit marks a tally whose request waits for its place (rule.WaitBit).
const waitBit = rule.WaitBit

// waitForPlace holds the request of charge c until the place its tally t
// reserved comes (awaitPlace); a client gone meanwhile leaves it refused
// (verdict answers no one, passes nothing on). One that goes on is shown as
// of its place (RateLimit's t, 0 past a reset, a month's policy; not items).
func waitForPlace(p *Plugin, rw http.ResponseWriter, req *http.Request, t *rule.Tally, c *rule.Charge) {
	t.Firsts &^= waitBit
	t.Refused = t.Refused || t.Wait > 0 && !awaitPlace(p, req, t, c)
	if t.Refused || !p.headers {
		return
	}

	at := c.Now + t.Wait
	if at > t.Reset {
		at = t.Reset
	}

	setHeaders(rw.Header(), c.Layers[t.Shown], t.Left, t.Reset, t.ResetH, at)
	if t.Firsts&monthPolicyBit != 0 {
		rule.SetMonthPolicy(rw.Header(), c.Layers[t.Shown], c.Now+t.Wait)
	}

	if t.Firsts&itemsBit != 0 {
		setItems(p, rw.Header(), t, c)
	}
}

// afterDelay runs f after d and returns what stops it: time.AfterFunc,
// which tests replace with their manual clock's timers. A function, not a
// select on a timer's channel, which Yaegi may not see fire (doc.go).
var afterDelay = func(d time.Duration, f func()) func() bool {
	return time.AfterFunc(d, f).Stop
}

// awaitPlace holds the request of charge c until the place its tally t
// reserved comes, and reports whether it may go on. When its client goes
// away first (the request's context ends), the place goes back to every
// layer the take charged (refund: the stores' own give-back) and the
// request is answered by no one, as a client that is gone reads nothing.
// The wait and the client's end arrive on one channel.
func awaitPlace(p *Plugin, req *http.Request, t *rule.Tally, c *rule.Charge) bool {
	ch := make(chan bool, 2)
	stopTimer := afterDelay(time.Duration(t.Wait), func() { ch <- true })
	stopWatch := context.AfterFunc(req.Context(), func() { ch <- false })
	ok := <-ch

	stopTimer()
	stopWatch()

	if !ok {
		refund(p.stores, rule.ChargeWithout(c, t.Uncharged), rule.CostOf(t))
	}

	return ok
}
