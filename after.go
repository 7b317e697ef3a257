package tierlimit

import (
	"bufio"
	"errors"
	"net"
	"net/http"
	"sync"

	"github.com/tierlimit/tierlimit/limit"
	"github.com/tierlimit/tierlimit/memstore"
	"github.com/tierlimit/tierlimit/request"
	"github.com/tierlimit/tierlimit/rule"
	"github.com/tierlimit/tierlimit/usage"
)

// In the recommended chain [edge, ForwardAuth, principal instance] the edge
// cannot tell a real credential from one the auth server will pass on as
// anonymous (an unknown scheme, an expired session treated as a guest), and
// the principal instance, which can, has no ip layer of its own. So the edge
// charges no tier bucket to a credentialed request and hands the decision on
// in the request's context; the instance after ForwardAuth settles it:
//   - a principal: the user or service tier, and the edge's ip bucket never;
//   - no principal: the edge's ip bucket, charged there and then, before the
//     backend, so a refusal is a 429 that the backend never sees.
//
// When nothing after the edge settles it (ForwardAuth answered itself, or the
// chain has no principal instance), the edge charges its ip bucket if the
// response status is one of principal.invalidCredentialStatus (chargeIP).
// Either way the request lands in exactly one tier bucket.
type pendingIP struct {
	edge    *Plugin
	req     *http.Request // as the edge saw it
	client  string        // the edge's key for its client; "" until pendingClient resolves it
	charged []*rule.Layer // the edge's layers charged up front (global, routes); nil: its planCred
	cost    int64         // what the request was charged in each of them, and is in ip (0: 1)
	skip    uint64        // bit i: charged[i] took nothing (tally.uncharged), so a refund skips it
	claimed bool          // settle's: whoever claims the charge decides it
}

// settle decides the ip charge left pending on a request, and is the only
// code that does: the first caller claims it, and every later call (the
// edge's writer after the principal instance, say) charges nothing, so no
// request is charged to ip twice. With charging unset (the principal
// instance found a principal) nothing is charged. With charging set, the
// edge's ip bucket is charged into t, and settle returns that charge (nil
// when it charged nothing); when it refuses, the
// layers the edge charged up front get their points back, since a refused
// request spends nothing (one noisy client with garbage credentials would
// otherwise spend global for everyone).
func settle(pd *pendingIP, t *rule.Tally, now int64, charging bool) *rule.Charge {
	if pd.claimed {
		return nil
	}

	pd.claimed = true
	if !charging {
		return nil
	}

	edge := pd.edge
	client := pendingClient(pd)
	cost := pd.cost
	if cost < 1 {
		cost = 1
	}

	t.Cost = cost
	c := chargeOf(edge.planInvalid, client, "", nil, now, edge.dryRun)
	take(edge.stores, t, c)

	charged := pd.charged
	if charged == nil {
		charged = edge.planCred
	}

	if t.Refused && !edge.dryRun && len(charged) > 0 {
		refund(edge.stores, chargeOf(rule.ChargedOnly(memstore.ExceptUncharged(charged, pd.skip)), client, "", pd.req, now, false), cost)
	}

	return c
}

// pendingClient returns the edge's key for the client of a request whose ip
// charge is pending, resolving it the first time: a charge that a principal
// settles never needs it.
func pendingClient(pd *pendingIP) string {
	if pd.client == "" {
		pd.client = clientKey(pd.edge.ips, pd.req)
	}

	return pd.client
}

// pendingKey is the context key of a *pendingIP. A pointer of a compiled type:
// unique, comparable, and the same for every instance of the plugin, which
// share one interpreter.
var pendingKey = new(byte)

// afterAuthPlan is the plan of a request at an instance placed after
// ForwardAuth (userHeader set): its principal's tier; none of this instance's
// tiers when an earlier instance left its ip charge pending (charged here to
// that instance's ip bucket); else ip or assets. It settles the pending charge
// either way. ok is false when the pending charge refused the request, which
// has then been answered.
func afterAuthPlan(p *Plugin, rw http.ResponseWriter, req *http.Request, principal string) (layers []*rule.Layer, ok bool) {
	if pd, _ := req.Context().Value(pendingKey).(*pendingIP); pd != nil {
		var t rule.Tally

		now := pd.edge.now().UnixNano()
		if c := settle(pd, &t, now, principal == ""); c != nil {
			if ok, _ = verdict(pd.edge, rw, req, &t, c); !ok {
				return nil, false
			}

			return p.planCred, true
		}
	}

	switch {
	case principal != "":
		return principalPlan(p, req), true
	case p.assetHint != nil && p.assetHint.MatchString(req.URL.Path) && isAsset(p, req):
		return p.planAssets, true
	}

	return p.planIP, true
}

// replacedHeaders describe the downstream's body or challenge, which a 429 replaces.
var replacedHeaders = []string{
	"Content-Length", "Content-Encoding", "Content-Range", "Content-Disposition",
	"Etag", "Last-Modified", "Www-Authenticate", "Transfer-Encoding",
}

// chargeIP charges the client's ip bucket for an invalid credential, unless
// an instance after ForwardAuth settled the charge already (settle), and,
// when the bucket refuses, answers 429 (or 1013) in place of the downstream.
// It reports whether it did.
func (w *watchWriter) chargeIP() bool {
	p := w.p
	h := w.rw.Header()
	now := p.now().UnixNano()

	var t rule.Tally

	c := settle(w.pending, &t, now, true)
	if c == nil {
		return false
	}

	if t.Firsts != 0 {
		report(p, c, t.Firsts)
	}

	if t.Shown < 0 {
		return false
	}

	ip := p.planInvalid[0]

	if t.Refused && !p.dryRun {
		for _, name := range replacedHeaders {
			h.Del(name)
		}

		if p.headers {
			setHeaders(h, ip, t.Left, t.Reset, t.ResetH, now)
			rule.MonthPolicyOf(h, ip, now)
		}

		reject(p, w.rw, w.req, ip, t.Reset, now)

		return true
	}

	if p.headers && (w.prevLeft < 0 || limit.FewerLeft(t.Left, w.prevLeft)) {
		setHeaders(h, ip, t.Left, t.Reset, t.ResetH, now)
		rule.MonthPolicyOf(h, ip, now)
	}

	return false
}

// watchWriter watches the status that the rest of the chain (ForwardAuth or
// the application) gives a request whose charge depends on it, and decides
// that charge before the status goes out, so that the headers can show it:
//   - pending: a credentialed request's ip charge (pendingIP), charged when
//     the downstream answers one of principal.invalidCredentialStatus; once
//     the client's ip bucket is exhausted the client gets the 429 instead of
//     the downstream's answer, so a garbage token cannot dodge the per-IP
//     limit.
//   - routes: the countStatus routes the request matched, charged when
//     their list holds the status. A WebSocket upgrade is
//     watched too, as its answer may be a listed 401; its 101, written on the
//     hijacked connection, counts only where 101 is listed.
//
// Compiled code sees this wrapper through an adapter that has Hijack but no
// Flush (doc.go: wrappers), so Traefik's proxy cannot flush through it. The
// wrapper flushes the original writer itself after every write of a response
// without a Content-Length (event streams, gRPC, chunked bodies), which keeps
// streaming live, and passes Hijack through for WebSocket upgrades.
type watchWriter struct {
	self http.ResponseWriter // this writer as compiled code sees it (watchPool)

	rw       http.ResponseWriter
	req      *http.Request
	p        *Plugin
	prevLeft int64 // requests left in the layer the headers show; -1 if none

	pending *pendingIP // a credentialed request's ip charge; nil: none

	routes            []*route     // the routes matched, some with countStatus; nil: none
	client, principal string       // the routes' keys, on serveCountedFast
	decided           *rule.Charge // serveCounted's: the decision, whose client and keys the routes' charges take
	cost              int64        // the request's cost, which a listed status charges

	reserved []reservation // what costFrom routes hold for the request (meter.go); nil: none
	bodyLeft int64         // the bytes of the body its Content-Length still announces; -1: none
	settled  bool          // the reservations are settled

	wroteHeader bool
	discard     bool // the downstream's answer was replaced by a 429
	flushEach   bool
	pooled      bool // serveCounted's, from watchPool: it goes back there
}

// watchPool holds watchWriters between requests, each with its self made
// once: under Yaegi, converting an interpreted writer to http.ResponseWriter
// builds a compiled adapter, about 30 allocations a request (doc.go:
// wrappers). A writer goes back to the pool only once next has returned, when
// nothing may use it any more (net/http's rule for a ResponseWriter).
var watchPool sync.Pool

// newPooledWatch is a watchWriter for watchPool, its self converted.
func newPooledWatch() *watchWriter {
	ww := &watchWriter{}
	ww.self = ww

	return ww
}

func (w *watchWriter) Header() http.Header {
	return w.rw.Header()
}

func (w *watchWriter) WriteHeader(code int) {
	if w.wroteHeader {
		return
	}

	if code >= 100 && code < 200 && code != http.StatusSwitchingProtocols {
		// Informational responses precede the final one.
		w.rw.WriteHeader(code)
		return
	}

	w.wroteHeader = true

	if w.routes != nil {
		countStatus(w, code)
	}

	if w.pending != nil && w.p.invalidCode[code] && w.chargeIP() {
		w.discard = true
		return
	}

	if w.reserved != nil {
		startReading(w)
	}

	w.flushEach = w.rw.Header().Get("Content-Length") == ""
	w.rw.WriteHeader(code)

	if w.flushEach {
		w.Flush()
	}
}

func (w *watchWriter) Write(b []byte) (int, error) {
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}

	if w.discard {
		return len(b), nil
	}

	// Read before the client has it: the last bytes of a body of known
	// length settle first (readBody).
	if w.reserved != nil && !w.settled {
		readBody(w, b)
	}

	n, err := w.rw.Write(b)
	if w.flushEach {
		w.Flush()
	}

	return n, err
}

// Flush flushes the original writer, for interpreted callers and for Write.
func (w *watchWriter) Flush() {
	if f, ok := w.rw.(http.Flusher); ok {
		f.Flush()
	}
}

// Hijack hands over the original connection, for WebSocket upgrades: the
// response is then the 101 the proxy writes on it.
func (w *watchWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	h, ok := w.rw.(http.Hijacker)
	if !ok {
		return nil, nil, errHijackUnsupported
	}

	if !w.wroteHeader && w.routes != nil {
		w.wroteHeader = true
		countStatus(w, http.StatusSwitchingProtocols)
	}

	return h.Hijack()
}

var errHijackUnsupported = errors.New("hijacking the connection: the response writer does not support it")

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
	matched   []*route // the routes the request matches
	cost      int64
	counted   []*route
	principal string // whose plan picks a route's window (route.plans)
	// metered are the matched costFrom routes, whose layers end the
	// request's charge, in this order; reserved what takeReserving
	// reserved for them (meter.go).
	metered  []*route
	reserved []reservation
}

// serveCounted passes on a request that matched countStatus or costFrom
// routes with its response watched, and settles the costFrom routes'
// reservations when it has ended (meter.go): out is what next would get otherwise (rw, or the
// watchWriter of a credentialed request, which then watches for both,
// around the original writer, to which serveUpgrade writes its refusals);
// c is the request's charge, whose client and principal key the routes.
// left is what the headers show (-1: none).
//
// The settlement is deferred: Traefik's proxy does not return when the
// client hangs up mid-body, it panics with http.ErrAbortHandler, and a
// handler after this one may panic too. A panic goes on once the request
// is settled (no recover: the deferred call runs as the panic unwinds).
func serveCounted(p *Plugin, out http.ResponseWriter, req *http.Request, c *rule.Charge, hits *routeHits, left int64) {
	// out is this instance's watchWriter already converted to the
	// interface, or the writer a pooled one wraps (watchPool; doc.go:
	// wrappers). Another instance's watchWriter (the edge's, when this
	// instance follows it and ForwardAuth in a chain) is a writer like any
	// other: reusing it would settle this instance's routes with the edge's
	// stores and events.
	ww, watched := out.(*watchWriter)
	if watched && ww.p != p {
		// Under Yaegi, the failed assertion of an empty pool's nil below
		// would leave ww as it is: the other instance's writer, which it
		// would then overwrite.
		watched = false
		ww = nil
	}

	if !watched {
		ww, _ = watchPool.Get().(*watchWriter)
		if ww == nil {
			ww = newPooledWatch()
		}
		*ww = watchWriter{self: ww.self, rw: out, req: req, p: p, prevLeft: left, pooled: true}
		out = ww.self
	}
	ww.routes = hits.counted
	ww.decided = c
	ww.cost = hits.cost
	ww.reserved = hits.reserved
	if hits.reserved != nil && req.Header["Accept-Encoding"] != nil {
		// Only what the readers decode (meter.go).
		usage.NarrowAcceptEncoding(req.Header)
	}

	defer endCounted(ww)

	if p.ws != nil && request.IsUpgrade(req) {
		serveUpgrade(p, out, ww.rw, req, c.Client)
	} else {
		p.next.ServeHTTP(out, req)
	}

	// A handler that wrote nothing answered 200, which net/http sends; one
	// that panicked answered nothing this instance saw.
	if !ww.wroteHeader {
		ww.wroteHeader = true
		countStatus(ww, http.StatusOK)
	}
}

// chargeDecided is the charge of layers, the charge layers of w's counted
// routes, each with the key the decision found for its route: the body a
// json: key is read from is the backend's by now.
func chargeDecided(w *watchWriter, layers []*rule.Layer, now int64) *rule.Charge {
	d := w.decided
	keys := make([]string, len(layers))

	for i, l := range layers {
		for _, rt := range w.routes {
			if rt.charge != l {
				continue
			}

			for j, checked := range d.Layers {
				if checked == rt.layer {
					keys[i] = d.Keys[j]
				}
			}
		}
	}

	return &rule.Charge{Layers: layers, Keys: keys, Client: d.Client, Principal: d.Principal, Now: now, All: w.p.dryRun}
}

// endCounted is what serveCounted does once its request has ended, however
// it ended: the reservations settled, a pooled writer back in the pool, as
// nothing uses it any more.
func endCounted(ww *watchWriter) {
	if ww.reserved != nil {
		settleReservations(ww)
	}

	if ww.pooled {
		*ww = watchWriter{self: ww.self}
		watchPool.Put(ww)
	}
}

// countStatus charges the routes that list code, and shows the charge in the
// headers when it leaves fewer requests than they show.
func countStatus(w *watchWriter, code int) {
	for _, rt := range w.routes {
		if rt.countStatus[code] {
			chargeStatus(w, code)
			return
		}
	}
}

// chargeStatus is countStatus for a status some route lists: a function of
// its own, so that a response no route counts costs countStatus's frame
// only (doc.go: frames).
func chargeStatus(w *watchWriter, code int) {
	var layers []*rule.Layer

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
	t := rule.Tally{Cost: w.cost}

	var c *rule.Charge
	if w.decided != nil {
		c = chargeDecided(w, layers, now)
	} else {
		c = chargeOf(layers, w.client, w.principal, w.req, now, p.dryRun)
	}
	take(p.stores, &t, c)

	if p.headers && t.Shown >= 0 && (w.prevLeft < 0 || limit.FewerLeft(t.Left, w.prevLeft)) {
		setHeaders(w.rw.Header(), layers[t.Shown], t.Left, t.Reset, t.ResetH, now)
	}

	// After the headers, which a month layer's mark corrects (stores.month).
	if t.Firsts != 0 {
		reportTally(p, w.rw, &t, c)
	}
}
