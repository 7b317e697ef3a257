package tierlimit

import (
	"net/http"
)

// A route with countStatus (a login limit that counts failed logins only) is
// charged after the response, and only when its status is listed. Up front
// its layer is check-only (layer.checkOnly): the request is refused when the
// route's budget for its key cannot take its cost, and otherwise charged
// nothing there, while the other layers of its plan charge as usual, all or
// nothing among themselves. Once the response's status is known, a listed
// one is charged to the route's charging layer (route.charge: the same
// counters) with the request's cost, in a take of its own that stops at a
// refusal: requests in flight when the budget runs out are each counted
// while they fit, and the count never exceeds the points, so the route
// refuses no longer than its rule says. A charge that no longer fits is
// counted as a refusal of the layer in its statistics; the response passes
// unchanged either way.

// routeHits is what the matching routes of a request add to its charge: the
// largest cost among them (0: none matched), and those that count only
// listed statuses.
type routeHits struct {
	cost    int64
	counted []*route
}

// serveCounted passes on a request that matched countStatus routes with its
// response watched: out is what next would get otherwise (rw, or the
// watchWriter of a credentialed request, which then watches for both,
// around the original writer, to which serveUpgrade writes its refusals);
// c is the request's charge, whose client and principal key the routes.
// left is what the headers show (-1: none).
func serveCounted(p *Plugin, out http.ResponseWriter, req *http.Request, c *charge, hits *routeHits, left int64) {
	ww, ok := out.(*watchWriter)
	if !ok {
		ww = &watchWriter{rw: out, req: req, p: p, prevLeft: left}
	}
	ww.routes = hits.counted
	ww.client = c.Client
	ww.principal = c.Principal
	ww.cost = hits.cost

	// Converted to the interface first (doc.go: wrappers).
	var w http.ResponseWriter = ww
	if p.ws != nil && isUpgrade(req) {
		serveUpgrade(p, w, ww.rw, req, c.Client)
	} else {
		p.next.ServeHTTP(w, req)
	}

	// A handler that wrote nothing answered 200, which net/http sends.
	if !ww.wroteHeader {
		ww.wroteHeader = true
		ww.count(http.StatusOK)
	}
}

// count charges the routes that list code, and shows the charge in the
// headers when it leaves fewer requests than they show.
func (w *watchWriter) count(code int) {
	var layers []*layer

	for _, rt := range w.routes {
		if rt.countStatus[code] {
			layers = append(layers, rt.charge)
		}
	}

	if layers == nil {
		return
	}

	p := w.p
	now := p.now().UnixNano()
	t := tally{Cost: w.cost}

	c := chargeOf(layers, w.client, w.principal, w.req, now, p.dryRun)
	p.store.Take(&t, c)

	if p.headers && t.Shown >= 0 && (w.prevLeft < 0 || t.Left < w.prevLeft) {
		setHeaders(w.rw.Header(), layers[t.Shown], t.Left, t.Reset, t.ResetH, now)
	}

	// After the headers, which a month layer's mark corrects (monthStore).
	if t.Firsts != 0 {
		reportTally(p, w.rw, &t, c)
	}
}
