// Package tierlimit is a Traefik middleware plugin that limits requests with
// several fixed-window layers: global, per client IP, per IP for public assets,
// per principal, and per route. See README.md for the configuration.
package tierlimit

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/tierlimit/tierlimit/redisresp"
)

// Plugin is the middleware. It is safe for concurrent use; everything but the
// counters is fixed in New.
//
// Traefik runs this code in the Yaegi interpreter, where each function call
// allocates every local of the callee and a defer or a per-request slice of
// structs costs microseconds. So New precomputes the layer lists ("plans")
// each kind of request is charged to and the header values; the common
// instances (memory store, no routes or credentials: the edge and the principal
// instance of the recommended chain) are served by one function, serveSimple;
// and rarer work (credentials, routes, WebSocket caps, refusals) lives in
// functions that only those requests call. BENCHMARKS.md has the figures.
type Plugin struct {
	next    http.Handler
	name    string
	cfg     *settings
	now     func() time.Time
	active  bool // enabled, and some layer or the connection cap is on
	general bool // credentials, routes, a connection cap, or off: serveGeneral
	simple  bool // not general; memory store, headers, no dry run: serveSimple
	divert  bool // simple, with credential headers or routes: classify each request
	watch   bool // credentialed requests' responses are watched for an invalid-credential status

	// The methods some route is limited to; nil when a route takes every
	// method (or there is none), so that serveSimple can skip the routes of
	// other methods without a call.
	routeMethods map[string]bool

	store  counterStore
	memory *windowStore // the memory store, or the redis store's fallback
	ips    ipResolver
	events *eventLog

	global  *layer // nil when off, like every layer
	ip      *layer
	assets  *layer
	user    *layer
	service *layer
	routes  []*route
	layers  []*layer // every layer that is on, in evaluation order (status, metrics)

	// The layers charged up front, by kind of request, in evaluation order.
	planIP, planAssets, planUser, planService, planCred, planInvalid []*layer

	assetPaths    []string
	userHeader    string // canonical; "" when principal tiers are off
	serviceHeader string // canonical
	credentials   bool   // some credential header, cookie or query parameter is configured
	credHeaders   []string
	credCookies   []string
	credQuery     []string

	ws      *connCounter // nil when websocket.maxConnectionsPerIP is 0
	wsLayer *layer       // stands for the connection cap in a refusal

	status     bool     // status.path is set
	exempt     bool     // some exempt IP or principal is configured
	planExempt []*layer // global, unless exempt.global

	// Request paths are matched in their canonical form (path.go), computed
	// once per request, in lower case when the asset prefixes (or, without
	// them, some route) ignore case; a route that wants the other form
	// converts it.
	paths     bool // some route or asset prefix: canonicalise each request's path
	foldPaths bool
}

// How a layer finds its key in a request.
const (
	keyOfClient              = iota // the client IP (ip, assets, routes keyed by ip)
	keyOfPrincipal                  // the principal id (user, service)
	keyOfConst                      // layer.constKey (global, routes keyed by global)
	keyOfPrincipalElseClient        // routes keyed by principal
	keyOfHeader                     // "header:<Name>": the value hashed, else the client IP
	keyOfHost                       // "host": the request's host (hostKey), else the client IP
)

// layer is a layer as the request path uses it: its limits, its counters in
// the memory store and the header values that do not depend on the request.
type layer struct {
	name      string
	points    int64
	duration  int64 // nanoseconds
	keyKind   int
	constKey  string
	keyHeader string // canonical, for keyOfHeader
	sliding   bool   // sliding-window counter instead of a fixed window
	interval  int64  // token bucket: nanoseconds per point (tokenbucket.go); 0 for a window
	rate      int64  // token bucket: the points per duration configured; points is then the burst

	stats *layerStats // decisions since the process started, shared across reloads

	entries map[string]*window // this layer's counters in the memory store
	list    *windowList        // the memory store's list for this duration

	limit     string // points, formatted
	redisArgs string // points, window (ms) and algorithm as the script's RESP-encoded arguments
	maxTTL    int64  // the longest reset the script may report, in ms: the window, twice for sliding

	// Redis store: the key up to the bucket key, and a constant key whole,
	// RESP-encoded (both set by New).
	redisKey, redisConstKey string
	limitHdr                []string // X-RateLimit-Limit value (shared, never modified)
	policyHdr               []string // RateLimit-Policy value (shared, never modified)

	// The refusal: status, content type, and either a template (response.body)
	// or the design note's JSON body around its reset time (layer names need
	// no JSON escaping: validName).
	status                 int
	contentType            []string
	body                   []bodyPart
	bodyPrefix, bodySuffix string

	// By requests left, for the first maxPrecomputed values (see setHeaders):
	remainingHdr [][]string // X-RateLimit-Remaining values
	ratePrefix   []string   // RateLimit values up to the seconds: `"name";r=12;t=`
}

// maxPrecomputed bounds the per-layer header tables; layers with more points
// format the larger values per request.
const maxPrecomputed = 4096

// keyFor returns the layer's bucket key for a request. A principal-keyed route
// counts requests without a principal per client IP, in a namespace of its own
// so that an IP never shares a bucket with a principal id. A header-keyed layer
// falls back to the client IP, never to a shared empty key.
func (l *layer) keyFor(client, principal string, req *http.Request) string {
	switch l.keyKind {
	case keyOfClient:
		return client
	case keyOfPrincipal:
		return principal
	case keyOfConst:
		return l.constKey
	case keyOfHeader:
		// A credential such as an API key: hashed, never kept in clear.
		if req == nil {
			return client
		}

		if v := req.Header[l.keyHeader]; len(v) > 0 && strings.TrimSpace(v[0]) != "" {
			return hashKey(strings.TrimSpace(v[0]))
		}

		return client
	case keyOfHost:
		if req == nil {
			return client
		}

		return hostKey(req.Host, client)
	}

	if principal != "" {
		return principal
	}

	return "ip:" + client
}

// route is a route limit with its matcher.
type route struct {
	layer         *layer
	methods       []string
	exact         map[string]bool // canonical (path.go)
	prefixes      []string
	lower         bool // ignores case where the instance's paths keep theirs: lowers the path
	caseSensitive bool // compares case where the instance's paths are lowered: canonicalises anew
}

// New builds the middleware from a validated configuration. It does no I/O:
// counters live in the package registry, keyed by name, so routers that share
// the middleware share its budget and reloads keep the counts.
func New(ctx context.Context, next http.Handler, config *Config, name string) (http.Handler, error) {
	cfg, err := parse(config)
	if err != nil {
		return nil, fmt.Errorf("configuring %s: %w", name, err)
	}

	memory := registry.get(ctx, name, cfg.maxTracked)
	store := counterStore(memory)

	if cfg.store == "redis" {
		store = &redisStore{
			prefix:  cfg.keyPrefix + ":" + name + ":",
			backend: backends.get(ctx, cfg.redis),
			local:   memory,
			blocked: registry.blockListFor(ctx, name, cfg.maxTracked),
		}
	}

	p := &Plugin{
		next:   next,
		name:   name,
		cfg:    cfg,
		now:    time.Now,
		store:  store,
		memory: memory,
		ips:    ipResolver{proxies: cfg.proxies, hops: cfg.hops, ipv6Prefix: cfg.ipv6Prefix},
		events: newEventLog(eventWriter, name),

		global:  newLayer(memory, cfg.global, keyOfConst),
		ip:      newLayer(memory, cfg.ip, keyOfClient),
		assets:  newLayer(memory, cfg.assets, keyOfClient),
		user:    newLayer(memory, cfg.user, keyOfPrincipal),
		service: newLayer(memory, cfg.service, keyOfPrincipal),

		assetPaths:    cfg.assetPaths,
		userHeader:    http.CanonicalHeaderKey(cfg.principal.UserHeader),
		serviceHeader: http.CanonicalHeaderKey(cfg.principal.ServiceAccountHeader),
		credCookies:   cfg.principal.CredentialCookies,
		credQuery:     cfg.principal.CredentialQueryParams,
	}

	// An instance after ForwardAuth (userHeader set) knows whether a request
	// has a principal; a credential tells it nothing more (chain.go).
	if p.userHeader != "" {
		p.credCookies = nil
		p.credQuery = nil
	} else {
		for _, h := range cfg.principal.CredentialHeaders {
			p.credHeaders = append(p.credHeaders, http.CanonicalHeaderKey(h))
		}
	}

	p.credentials = len(p.credHeaders)+len(p.credCookies)+len(p.credQuery) > 0

	kinds := map[string]int{keyIP: keyOfClient, keyPrincipal: keyOfPrincipalElseClient, keyGlobal: keyOfConst, keyHeader: keyOfHeader, keyHost: keyOfHost}

	for _, rs := range cfg.routes {
		if rs.on() {
			p.routes = append(p.routes, &route{
				layer: newLayer(memory, rs.layerSpec, kinds[rs.key]), methods: rs.methods, exact: rs.exact, prefixes: rs.prefixes,
				caseSensitive: rs.caseSensitive,
			})

			p.foldPaths = p.foldPaths || !rs.caseSensitive
		}
	}

	p.paths = p.routes != nil || p.assetPaths != nil
	if p.assetPaths != nil {
		p.foldPaths = !cfg.assetsCase
	}

	for _, rt := range p.routes {
		rt.lower = !rt.caseSensitive && !p.foldPaths
		rt.caseSensitive = rt.caseSensitive && p.foldPaths
	}

	p.layers = plan(p.global, p.ip, p.assets, p.user, p.service)
	for _, rt := range p.routes {
		p.layers = append(p.layers, rt.layer)
	}

	p.planIP = plan(p.global, p.ip)
	p.planAssets = plan(p.global, p.assets)
	p.planUser = plan(p.global, p.user)
	p.planService = plan(p.global, p.service)
	p.planCred = plan(p.global)
	p.planInvalid = plan(p.ip)

	if cfg.wsMaxPerIP > 0 {
		p.ws = connCounters.get(ctx, name, cfg.wsMaxPerIP)
		p.wsLayer = newLayer(memory, layerSpec{name: "websocket", points: int64(cfg.wsMaxPerIP), duration: time.Second}, keyOfClient)
	}

	if rs, ok := store.(*redisStore); ok {
		for _, l := range p.layers {
			l.redisKey = rs.prefix + l.name + ":"
			l.redisConstKey = redisresp.Bulk(l.redisKey + l.constKey)
		}

		// A plan has at most every layer: global, one tier and the routes.
		for n := 0; n <= len(p.layers); n++ {
			rs.calls = append(rs.calls, takeRedis.Call(n, 5*n+1))
		}
	}

	p.setResponse()

	p.status = cfg.statusPath != ""
	p.exempt = len(cfg.exemptIPs)+len(cfg.exemptIDs) > 0
	if !cfg.exemptGlobal {
		p.planExempt = plan(p.global)
	}

	// serveSimple's loop knows fixed windows keyed by client, principal or constant.
	inlined := true
	for _, l := range p.layers {
		inlined = inlined && l.keyKind != keyOfHeader && l.keyKind != keyOfHost && !l.sliding && l.interval == 0
	}

	p.active = cfg.enabled && (len(p.planIP)+len(p.planAssets)+len(p.planUser)+len(p.planService)+len(p.routes) > 0 || p.ws != nil)
	// Credential headers and routes leave an instance on serveSimple, which
	// serves credentialed requests itself and hands route matches to
	// serveGeneral (divert): the recommended chain's edge stays on it.
	p.general = !p.active || len(p.credCookies)+len(p.credQuery) > 0 || p.ws != nil || p.exempt || !inlined
	p.simple = !p.general && cfg.store == "memory" && cfg.headers && !cfg.dryRun
	p.divert = p.simple && (p.credHeaders != nil || p.routes != nil)
	p.watch = p.ip != nil

	for _, rt := range p.routes {
		if len(rt.methods) == 0 {
			p.routeMethods = nil
			break
		}

		if p.routeMethods == nil {
			p.routeMethods = map[string]bool{}
		}

		for _, m := range rt.methods {
			p.routeMethods[m] = true
		}
	}

	return p, nil
}

// plan lists the layers that are on, in order.
func plan(layers ...*layer) []*layer {
	var out []*layer

	for _, l := range layers {
		if l != nil {
			out = append(out, l)
		}
	}

	return out
}

// newLayer returns nil for a layer that is off.
func newLayer(memory *windowStore, spec layerSpec, keyKind int) *layer {
	if !spec.on() {
		return nil
	}

	l := &layer{
		name:      spec.name,
		points:    spec.points,
		duration:  int64(spec.duration),
		keyKind:   keyKind,
		constKey:  layerGlobal,
		keyHeader: spec.keyHeader,
		sliding:   spec.sliding,
		limit:     formatInt(spec.points),
	}

	if spec.keyHeader != "" {
		l.keyKind = keyOfHeader
	}

	if spec.keyHost {
		l.keyKind = keyOfHost
	}

	if spec.bucket {
		spec = l.makeBucket(spec)
	}

	l.redisArgs = redisresp.Bulk(l.limit) + redisresp.Bulk(formatInt(int64(spec.duration/time.Millisecond))) + bulkFalse + bulkFalse
	if spec.sliding {
		l.redisArgs = redisresp.Bulk(l.limit) + redisresp.Bulk(formatInt(int64(spec.duration/time.Millisecond))) + bulkTrue + bulkFalse
	}

	l.maxTTL = int64(spec.duration / time.Millisecond)
	if spec.sliding {
		l.maxTTL *= 2
	}

	if spec.bucket {
		l.redisArgs = redisresp.Bulk(l.limit) + redisresp.Bulk(formatInt(int64(spec.duration/time.Millisecond))) + bulkBucket + redisresp.Bulk(formatInt(l.rate))
		l.maxTTL = (spec.points*int64(spec.duration/time.Millisecond)+l.rate-1)/l.rate + 1
	}
	l.bodyPrefix = `{"errors":[{"message":"Hit rate limit","extensions":{"code":"REQUESTS_EXCEEDED","limit":` + l.limit + `,"reset":"`
	l.bodySuffix = `","layer":"` + l.name + `"}}]}`
	l.limitHdr = []string{l.limit}
	l.policyHdr = []string{`"` + spec.name + `";q=` + l.limit + ";w=" + formatInt(ceilSeconds(l.duration))}
	if spec.bucket {
		l.policyHdr = []string{`"` + spec.name + `";q=` + l.limit + ";w=" + formatInt(ceilSeconds(spec.points*l.interval))}
	}

	for left := int64(0); left <= spec.points && left < maxPrecomputed; left++ {
		l.remainingHdr = append(l.remainingHdr, []string{formatInt(left)})
		l.ratePrefix = append(l.ratePrefix, `"`+spec.name+`";r=`+formatInt(left)+";t=")
	}

	memory.attach(l)

	return l
}

// serveOther is ServeHTTP for every instance but the common ones: serveGeneral,
// or for an anonymous instance on Redis or without headers, the few lines below.
func (p *Plugin) serveOther(rw http.ResponseWriter, req *http.Request, path string) {
	if p.general || p.userHeader != "" || p.credentials || p.routes != nil {
		p.serveGeneral(rw, req, path)
		return
	}

	layers := p.planIP
	if p.assetPaths != nil && hasAnyPrefix(path, p.assetPaths) {
		layers = p.planAssets
	}

	if ok, _ := p.decide(rw, req, layers, p.ips.clientKey(req), ""); ok {
		p.next.ServeHTTP(rw, req)
	}
}

// ServeHTTP charges the request to its layers, in the order global, tier,
// routes, and either refuses it or passes it on with the rate-limit headers.
// The common instances take serveSimple, every other one serveOther. Both are
// calls of their own because under Yaegi a function's whole frame is
// allocated on each call, the locals of branches not taken included: served
// from here, the common case would cost every other one ~170 allocations.
func (p *Plugin) ServeHTTP(rw http.ResponseWriter, req *http.Request) {
	// The status endpoint, for an allowed client (status.go). One field test:
	// under Yaegi every expression here costs every request, taken or not.
	if p.status && p.serveStatus(rw, req) {
		return
	}

	// Matched against routes and asset prefixes, never passed on: the
	// backend gets the request as it came.
	path := ""
	if p.paths {
		path = canonicalPath(req.URL.Path, p.foldPaths)
	}

	if p.simple {
		kind := plainRequest
		if p.divert {
			kind = p.classify(req, path)
		}

		if kind != routedRequest {
			p.serveSimple(rw, req, kind == credentialedRequest, path)
			return
		}
	}

	p.serveOther(rw, req, path)
}

// serveSimple is ServeHTTP for the most common instances, the edge and the
// principal instance of the recommended chain: layers charged up front only
// (global, ip, assets, user, service), the memory store, headers on, no dry
// run. It does in one function what decide, windowStore.take and setHeaders
// do for every other case, because under Yaegi each call allocates the
// callee's whole frame: this measured 1.65x cheaper than the general path
// (BENCHMARKS.md). Rare work stays in calls: new windows (restart), refusals
// (refuseSimple), large header values.
func (p *Plugin) serveSimple(rw http.ResponseWriter, req *http.Request, credentialed bool, path string) {
	client := ""
	if p.ips.hops == 0 && req.Header["X-Forwarded-For"] == nil {
		i := strings.LastIndexByte(req.RemoteAddr, ':')
		if i > 0 && strings.IndexByte(req.RemoteAddr[:i], ':') < 0 {
			client = req.RemoteAddr[:i]
		}
	}

	if client == "" {
		client = p.ips.resolve(req)
	}

	principal := ""
	layers := p.planIP
	watch := false

	if p.userHeader != "" {
		principal = p.principalOf(req)

		var ok bool
		if layers, ok = p.afterAuthPlan(rw, req, principal, path); !ok {
			return
		}
	} else if credentialed {
		layers, watch = p.planCred, p.watch
	} else {
		for _, prefix := range p.assetPaths {
			if strings.HasPrefix(path, prefix) {
				layers = p.planAssets
			}
		}
	}

	now := p.now().UnixNano()
	s := p.memory

	var shown, refused *layer

	var sw *window

	left := int64(0)
	first := false

	s.mu.Lock()
	s.takes++

	for _, l := range layers {
		key := client
		if l.keyKind == keyOfConst {
			key = l.constKey
		} else if l.keyKind == keyOfPrincipal {
			key = principal
		}

		w := l.entries[key]
		if w != nil && w.reset > now && w.list == l.list {
			w.count++
			w.taken = s.takes
		} else {
			w = s.restart(now, l, w, key)
		}

		if w.count > l.points {
			l.stats.refused++
			refused, sw, first = l, w, !w.logged
			w.logged = true

			break
		}

		l.stats.allowed++

		if shown == nil || l.points-w.count < left {
			shown, sw, left = l, w, l.points-w.count
		}
	}

	if sw == nil {
		s.mu.Unlock()

		if watch {
			p.serveWatched(rw, req, client, -1)
			return
		}

		p.next.ServeHTTP(rw, req)

		return
	}

	count, reset, resetH := sw.count, sw.reset, sw.resetH

	s.mu.Unlock()

	if refused != nil {
		p.refuseSimple(rw, req, refused, count, reset, resetH, first, client, principal, now)
		return
	}

	h := rw.Header()
	h["X-Ratelimit-Limit"] = shown.limitHdr
	h["Ratelimit-Policy"] = shown.policyHdr
	h["X-Ratelimit-Reset"] = resetH
	secs := (reset - now + int64(time.Second) - 1) / int64(time.Second)

	if left < int64(len(shown.remainingHdr)) && secs < int64(len(smallInts)) {
		h["X-Ratelimit-Remaining"] = shown.remainingHdr[left]
		h["Ratelimit"] = []string{shown.ratePrefix[left] + smallInts[secs]}
	} else {
		setLargeHeaders(h, shown, left, secs)
	}

	if watch {
		p.serveWatched(rw, req, client, left)
		return
	}

	p.next.ServeHTTP(rw, req)
}

// serveWatched passes on a credentialed request with its response watched
// for an invalid-credential status (invalidcred.go); left is the requests
// left in the layer the headers show, -1 if none.
func (p *Plugin) serveWatched(rw http.ResponseWriter, req *http.Request, client string, left int64) {
	req, out := p.passCredentialed(rw, req, client, left)
	p.next.ServeHTTP(out, req)
}

// passCredentialed returns what next gets for a credentialed request whose ip
// charge is left pending (chain.go): the request carrying it, and the writer
// that watches the response for an invalid-credential status.
func (p *Plugin) passCredentialed(rw http.ResponseWriter, req *http.Request, client string, left int64) (*http.Request, http.ResponseWriter) {
	req, pd := p.withPending(req, client)

	// Yaegi wraps an interpreted type for compiled code only when it is
	// converted to the interface first; passing *credentialWriter straight to
	// next.ServeHTTP panics in reflect.
	var out http.ResponseWriter = rw
	if len(p.cfg.invalidCode) > 0 {
		out = newCredentialWriter(rw, req, p, client, left, pd)
	}

	return req, out
}

// refuseSimple answers a request that layer l refused on serveSimple's path.
func (p *Plugin) refuseSimple(rw http.ResponseWriter, req *http.Request, l *layer, count, reset int64, resetH []string, first bool, client, principal string, now int64) {
	if first {
		p.events.refused(l.name, l.keyFor(client, principal, nil), client)
	}

	setHeaders(rw.Header(), l, &tally{count: count, reset: reset, resetH: resetH}, now)

	if req.Header["Upgrade"] != nil {
		p.reject(rw, req, l, count, reset, now)
		return
	}

	refuse(rw, l, count, reset, now)
}

// serveGeneral is ServeHTTP for instances with credentials, routes or a
// connection cap, principals beyond serveSimple, or turned off.
func (p *Plugin) serveGeneral(rw http.ResponseWriter, req *http.Request, path string) {
	if !p.active {
		p.next.ServeHTTP(rw, req)
		return
	}

	client := p.ips.clientKey(req)
	principal := ""
	layers := p.planIP
	watch := false

	if p.userHeader != "" {
		principal = p.principalOf(req)
	}

	if p.exempt && p.isExempt(req, principal) {
		p.serveExempt(rw, req, client, principal)
		return
	}

	switch {
	case p.userHeader != "":
		var ok bool
		if layers, ok = p.afterAuthPlan(rw, req, principal, path); !ok {
			return
		}
	case p.credentials && p.hasCredential(req):
		layers, watch = p.planCred, p.watch
	case p.assetPaths != nil && hasAnyPrefix(path, p.assetPaths):
		layers = p.planAssets
	}

	if p.routes != nil {
		layers = p.withRoutes(layers, req, path)
	}

	ok, left := p.decide(rw, req, layers, client, principal)
	if !ok {
		return
	}

	var out http.ResponseWriter = rw
	if watch {
		req, out = p.passCredentialed(rw, req, client, left)
	}

	if p.ws != nil && isUpgrade(req) {
		p.serveUpgrade(out, rw, req, client)
		return
	}

	p.next.ServeHTTP(out, req)
}

// decide charges the layers, reports first refusals, sets the headers of the
// most restrictive layer and answers a refusal. It reports whether the request
// may go on, and the requests left in the layer the headers show (-1: none).
func (p *Plugin) decide(rw http.ResponseWriter, req *http.Request, layers []*layer, client, principal string) (bool, int64) {
	now := p.now().UnixNano()

	var t tally

	p.store.take(&t, now, layers, client, principal, req, p.cfg.dryRun)

	if t.firsts != 0 {
		p.report(layers, t.firsts, client, principal, req)
	}

	if t.shown < 0 {
		return true, -1
	}

	if p.cfg.headers {
		setHeaders(rw.Header(), layers[t.shown], &t, now)
	}

	if !t.refused || p.cfg.dryRun {
		return true, t.left
	}

	p.reject(rw, req, layers[t.shown], t.count, t.reset, now)

	return false, 0
}

// serveUpgrade passes on a WebSocket upgrade under the per-IP connection cap.
// out is what next gets (rw, or a credentialWriter around it); refusals are
// written to rw itself, which can be hijacked.
func (p *Plugin) serveUpgrade(out, rw http.ResponseWriter, req *http.Request, client string) {
	ok, first := p.ws.acquire(client)
	if first {
		p.events.refused(p.wsLayer.name, client, client)
	}

	if !ok && !p.cfg.dryRun {
		now := p.now().UnixNano()
		p.reject(rw, req, p.wsLayer, p.wsLayer.points+1, now+p.wsLayer.duration, now)

		return
	}

	if ok {
		// Held while the proxy serves the connection, which is its whole life.
		defer p.ws.release(client)
	}

	p.next.ServeHTTP(out, req)
}

// report writes an event for each layer whose refusal is the first of its window.
func (p *Plugin) report(layers []*layer, firsts uint64, client, principal string, req *http.Request) {
	for i, l := range layers {
		if firsts&(uint64(1)<<uint(i)) != 0 {
			p.events.refused(l.name, l.keyFor(client, principal, req), client)
		}
	}
}

// reject answers a refused request: a 429, or for a WebSocket upgrade a
// completed handshake closed with 1013.
func (p *Plugin) reject(rw http.ResponseWriter, req *http.Request, l *layer, count, reset, now int64) {
	if req.Header["Upgrade"] == nil || !isUpgrade(req) {
		refuse(rw, l, count, reset, now)
		return
	}

	plain := func() { refuse(rw, l, count, reset, now) }

	if l == p.wsLayer {
		refuseUpgrade(rw, req, "too many connections from this address", plain)
		return
	}

	retry := retryAfter(reset, now)
	rw.Header().Set("Retry-After", retry)
	refuseUpgrade(rw, req, "rate limit "+l.name+": retry in "+retry+"s", plain)
}

// principalPlan is the plan of a request with a principal: service or user.
func (p *Plugin) principalPlan(req *http.Request) []*layer {
	if p.isServiceAccount(req) {
		return p.planService
	}

	return p.planUser
}

// withRoutes appends the matching routes' layers to the plan; it allocates
// only when a route matches.
func (p *Plugin) withRoutes(layers []*layer, req *http.Request, path string) []*layer {
	var out []*layer

	for _, rt := range p.routes {
		if !rt.matches(req, path) {
			continue
		}

		if out == nil {
			out = make([]*layer, len(layers), len(layers)+len(p.routes))
			copy(out, layers)
		}

		out = append(out, rt.layer)
	}

	if out == nil {
		return layers
	}

	return out
}

// What classify finds in a request to a simple instance with credential
// headers or routes.
const (
	plainRequest        = iota
	credentialedRequest // a non-empty credential header: serveSimple watches its response
	routedRequest       // a route matches: serveGeneral decides
)

// classify tells serveSimple's requests from those serveGeneral decides. One
// call for both checks, and none for instances without credential headers or
// routes: under Yaegi each call allocates the callee's whole frame.
func (p *Plugin) classify(req *http.Request, path string) int {
	if p.routes != nil && (p.routeMethods == nil || p.routeMethods[req.Method]) && p.routeMatches(req, path) {
		return routedRequest
	}

	// As hasCredential does for headers: an empty value is no credential.
	for _, h := range p.credHeaders {
		if v := req.Header[h]; len(v) > 0 && strings.TrimSpace(v[0]) != "" {
			return credentialedRequest
		}
	}

	return plainRequest
}

// routeMatches reports whether some route matches the request.
func (p *Plugin) routeMatches(req *http.Request, path string) bool {
	for _, rt := range p.routes {
		if rt.matches(req, path) {
			return true
		}
	}

	return false
}

func hasAnyPrefix(path string, prefixes []string) bool {
	for _, prefix := range prefixes {
		if strings.HasPrefix(path, prefix) {
			return true
		}
	}

	return false
}

// matches reports whether the request, with its canonical path, is the
// route's. An exact path matches with or without a trailing slash.
func (rt *route) matches(req *http.Request, path string) bool {
	if len(rt.methods) > 0 {
		found := false

		for _, m := range rt.methods {
			if m == req.Method {
				found = true
				break
			}
		}

		if !found {
			return false
		}
	}

	if rt.lower {
		path = strings.ToLower(path)
	} else if rt.caseSensitive {
		path = canonicalPath(req.URL.Path, false)
	}

	n := len(path)

	return rt.exact[path] || n > 1 && path[n-1] == '/' && rt.exact[path[:n-1]] || hasAnyPrefix(path, rt.prefixes)
}
