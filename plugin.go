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
)

// Plugin is the middleware. It is safe for concurrent use; everything but the
// counters is fixed in New.
type Plugin struct {
	next http.Handler
	name string
	cfg  *settings
	now  func() time.Time

	store  counterStore
	memory *windowStore // the memory store, or the redis store's fallback
	ips    ipResolver
	events *eventLog

	global  *layer
	ip      *layer
	assets  *layer
	user    *layer
	service *layer
	routes  []*route

	ws      *connCounter // nil when websocket.maxConnectionsPerIP is 0
	wsLayer *layer       // stands for the connection cap in a refusal

	userHeader    string // canonical; "" when principal tiers are off
	serviceHeader string // canonical
	credHeaders   []string
	credCookies   []string
	credQuery     []string
}

// layer is a layer as the request path uses it: its limits, its counter list in
// the store and the header values that do not depend on the request.
type layer struct {
	name     string
	points   int64
	duration int64 // nanoseconds
	list     *windowList
	limit    string // points, formatted
	windowMS string // duration in milliseconds, formatted (Redis argument)
	policy   string // RateLimit-Policy item
}

// route is a route limit with its matcher.
type route struct {
	layer
	methods  []string
	exact    map[string]bool
	prefixes []string
	key      string
}

// New builds the middleware from a validated configuration. It does no I/O:
// counters live in the package registry, keyed by name, so routers that share
// the middleware share its budget and reloads keep the counts.
func New(ctx context.Context, next http.Handler, config *Config, name string) (http.Handler, error) {
	cfg, err := parse(config)
	if err != nil {
		return nil, fmt.Errorf("configuring %s: %w", name, err)
	}

	memory := registry.get(name, cfg.maxTracked)
	store := counterStore(memory)

	if cfg.store == "redis" {
		store = &redisStore{
			prefix:  cfg.keyPrefix + ":" + name + ":",
			backend: backends.get(cfg.redis),
			local:   memory,
			blocked: registry.blockListFor(name, cfg.maxTracked),
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

		global:  newLayer(memory, cfg.global),
		ip:      newLayer(memory, cfg.ip),
		assets:  newLayer(memory, cfg.assets),
		user:    newLayer(memory, cfg.user),
		service: newLayer(memory, cfg.service),

		userHeader:    http.CanonicalHeaderKey(cfg.principal.UserHeader),
		serviceHeader: http.CanonicalHeaderKey(cfg.principal.ServiceAccountHeader),
		credCookies:   cfg.principal.CredentialCookies,
		credQuery:     cfg.principal.CredentialQueryParams,
	}

	if cfg.wsMaxPerIP > 0 {
		p.ws = connCounters.get(name, cfg.wsMaxPerIP)
		p.wsLayer = newLayer(memory, layerSpec{name: "websocket", points: int64(cfg.wsMaxPerIP), duration: time.Second})
	}

	for _, h := range cfg.principal.CredentialHeaders {
		p.credHeaders = append(p.credHeaders, http.CanonicalHeaderKey(h))
	}

	for _, rs := range cfg.routes {
		if !rs.on() {
			continue
		}

		l := newLayer(memory, rs.layerSpec)
		p.routes = append(p.routes, &route{
			layer: *l, methods: rs.methods, exact: rs.exact, prefixes: rs.prefixes, key: rs.key,
		})
	}

	return p, nil
}

// newLayer returns nil for a layer that is off, so the request path tests one pointer.
func newLayer(memory *windowStore, spec layerSpec) *layer {
	if !spec.on() {
		return nil
	}

	return &layer{
		name:     spec.name,
		points:   spec.points,
		duration: int64(spec.duration),
		list:     memory.listFor(spec.duration),
		limit:    formatInt(spec.points),
		windowMS: formatInt(int64(spec.duration / time.Millisecond)),
		policy:   `"` + spec.name + `";q=` + formatInt(spec.points) + ";w=" + formatInt(ceilSeconds(int64(spec.duration))),
	}
}

// ServeHTTP charges the request to its layers, in the order global, tier,
// routes, and either refuses it or passes it on with the rate-limit headers.
func (p *Plugin) ServeHTTP(rw http.ResponseWriter, req *http.Request) {
	if !p.cfg.enabled {
		p.next.ServeHTTP(rw, req)
		return
	}

	clientKey := p.ips.clientKey(req)
	principal := p.principalOf(req)
	charges := make([]charge, 0, 4)

	if p.global != nil {
		charges = append(charges, charge{layer: p.global, key: layerGlobal})
	}

	l, key, credentialed := p.tier(req, principal, clientKey)
	if l != nil {
		charges = append(charges, charge{layer: l, key: key})
	}

	for _, rt := range p.routes {
		if rt.matches(req) {
			charges = append(charges, charge{layer: &rt.layer, key: rt.keyFor(principal, clientKey)})
		}
	}

	d := p.decide(rw.Header(), charges, clientKey)
	if d.refused {
		p.reject(rw, req, d)
		return
	}

	if p.ws != nil && isUpgrade(req) {
		ok, first := p.ws.acquire(clientKey)
		if first {
			p.events.refused(p.wsLayer.name, clientKey, clientKey)
		}

		if !ok && !p.cfg.dryRun {
			p.reject(rw, req, decision{now: d.now, shown: p.wsLayer,
				shownResult: result{count: p.wsLayer.points + 1, reset: d.now + p.wsLayer.duration}})

			return
		}

		if ok {
			// Held while the proxy serves the connection, which is its whole life.
			defer p.ws.release(clientKey)
		}
	}

	if credentialed && p.ip != nil && len(p.cfg.invalidCode) > 0 {
		// Yaegi wraps an interpreted type for compiled code only when it is
		// converted to the interface first; passing *credentialWriter straight
		// to next.ServeHTTP panics in reflect.
		var watched http.ResponseWriter = newCredentialWriter(rw, req, p, clientKey, d)
		p.next.ServeHTTP(watched, req)

		return
	}

	p.next.ServeHTTP(rw, req)
}

// reject answers a refused request: a 429, or for a WebSocket upgrade a
// completed handshake closed with 1013.
func (p *Plugin) reject(rw http.ResponseWriter, req *http.Request, d decision) {
	plain := func() { refuse(rw, d.shown, d.shownResult, d.now) }

	if !isUpgrade(req) {
		plain()
		return
	}

	if d.shown != p.wsLayer {
		retry := ceilSeconds(d.shownResult.reset - d.now)
		if retry < 1 {
			retry = 1
		}

		rw.Header().Set("Retry-After", formatInt(retry))
		refuseUpgrade(rw, req, "rate limit "+d.shown.name+": retry in "+formatInt(retry)+"s", plain)

		return
	}

	refuseUpgrade(rw, req, "too many connections from this address", plain)
}

// decision is what decide made of a request's charges.
type decision struct {
	now         int64
	refused     bool   // a layer refused and dryRun is off
	shown       *layer // the layer in the headers; nil when none applied
	shownResult result
}

// decide charges the layers, logs first refusals, and sets the rate-limit
// headers of the most restrictive layer: the one that refused, else the one
// with the fewest requests left. A nil h sets no headers.
func (p *Plugin) decide(h http.Header, charges []charge, clientKey string) decision {
	d := decision{now: p.now().UnixNano()}
	if len(charges) == 0 {
		return d
	}

	results := make([]result, len(charges))
	n := p.store.take(d.now, charges, results, p.cfg.dryRun)
	shown, refused := -1, -1

	for i := 0; i < n; i++ {
		c, res := charges[i], results[i]

		if res.count > c.layer.points && refused < 0 {
			refused = i
		}

		if res.firstRefusal {
			p.events.refused(c.layer.name, c.key, clientKey)
		}

		if shown < 0 || remaining(c.layer, res) < remaining(charges[shown].layer, results[shown]) {
			shown = i
		}
	}

	if refused >= 0 {
		shown = refused
	}

	d.shown, d.shownResult = charges[shown].layer, results[shown]
	d.refused = refused >= 0 && !p.cfg.dryRun

	if p.cfg.headers && h != nil {
		setHeaders(h, d.shown, d.shownResult, d.now)
	}

	return d
}

func (rt *route) matches(req *http.Request) bool {
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

	if rt.exact[req.URL.Path] {
		return true
	}

	for _, prefix := range rt.prefixes {
		if strings.HasPrefix(req.URL.Path, prefix) {
			return true
		}
	}

	return false
}

// keyFor returns the route's bucket key. A principal-keyed route falls back to
// the client IP for requests without a principal, in a namespace of its own so
// that an IP never shares a bucket with a principal id.
func (rt *route) keyFor(principal, clientKey string) string {
	switch rt.key {
	case keyGlobal:
		return layerGlobal
	case keyPrincipal:
		if principal != "" {
			return principal
		}

		return "ip:" + clientKey
	default:
		return clientKey
	}
}
