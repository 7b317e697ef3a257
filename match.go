package tierlimit

import (
	"net/http"
	"strings"

	"github.com/tierlimit/tierlimit/request"
	"github.com/tierlimit/tierlimit/rule"
	"github.com/tierlimit/tierlimit/usage"
)

// route is a route limit with its matcher.
type route struct {
	layer   *rule.Layer
	methods map[string]bool // nil: any method
	// exact holds the exact paths, canonical (request/path.go), each also
	// with a trailing slash: an exact path matches with or without one.
	exact         map[string]bool
	prefixes      []string
	lower         bool // ignores case where the instance's paths keep theirs: lowers the path
	caseSensitive bool // compares case where the instance's paths are lowered: canonicalises anew
	otherForm     bool // lower or caseSensitive: routeForm gives the path it compares
	// cost is what a matching request is charged in each of its layers
	// (config.Route.Cost).
	cost int64
	// countStatus holds the statuses charged to the route after the
	// response (nil: every request, up front); charge is then the route's
	// layer as that charge takes it: the same counters, not check-only.
	countStatus map[int]bool
	charge      *rule.Layer
	// costFrom is where the response states what a request cost the
	// route's layer (nil: it charges cost up front), which holds reserve
	// points for the request until then (meter.go).
	costFrom *usage.Expr
	reserve  int64
	// loud is the layer of a costFrom route in dry run beside rules that
	// enforce (layer.Quiet), as its reservation's take charges it: the same
	// counters, shown, so that the take reports the window's reset, which
	// the settlement's give-back needs (reserveFor). nil for other routes.
	loud []*rule.Layer
	// plans are the route's forms for principals on a plan (routes[].plans):
	// by plan name, a copy of the route with the plan's layer.
	plans map[string]*route
}

// routeForm is the path in the form route rt compares: lowered, or with
// its case. Apart from matchRoutes, so that the common route, in the
// instance's form, costs none of it (doc.go: frames).
func routeForm(rt *route, req *http.Request, path string) string {
	if rt.lower {
		return strings.ToLower(path)
	}

	return request.CanonicalPath(req.URL.Path, false)
}

// isAsset reports whether the request's canonical path starts with an asset
// prefix. A path that p.assetHint (request.AssetHint) does not match is none.
func isAsset(p *Plugin, req *http.Request) bool {
	return p.assetHint != nil && p.assetHint.MatchString(req.URL.Path) && request.HasAnyPrefix(request.CanonicalPath(req.URL.Path, p.foldPaths), p.assetPaths)
}

// isExempt reports whether exempt.ips holds the request's client address or
// exempt.principals its principal.
func isExempt(p *Plugin, req *http.Request, principal string) bool {
	return principal != "" && p.exempt.ids[principal] || request.ClientIn(p.ips, req, p.exempt.ips)
}

// serveExempt passes on an exempt request. No tier, route or connection cap
// charges it; the global layer does unless exempt.global is set, since the
// global budget protects the backend from everyone, exempt clients included.
// With no layer charged the response carries no rate-limit headers: no limit
// applies to it.
func serveExempt(p *Plugin, rw http.ResponseWriter, req *http.Request, client, principal string) {
	if p.held && p.exempt.plan != nil {
		serveExemptHeld(p, rw, req, client, principal)
		return
	}

	if p.exempt.plan != nil {
		if ok, _ := decide(p, rw, req, p.exempt.plan, client, principal, requestCost); !ok {
			return
		}
	}

	p.next.ServeHTTP(rw, req)
}
