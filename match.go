package tierlimit

import (
	"net"
	"net/http"
	"strings"

	"github.com/tierlimit/tierlimit/request"
	"github.com/tierlimit/tierlimit/usage"
)

// keyFor returns the layer's bucket key for a request. A principal-keyed route
// counts requests without a principal per client IP, in a namespace of its own
// so that an IP never shares a bucket with a principal id. A header-keyed layer
// falls back to the client IP, never to a shared empty key.
func keyFor(l *layer, client, principal string, req *http.Request) string {
	switch l.KeyKind {
	case keyOfClient:
		return client
	case keyOfPrincipal:
		return principal
	case keyOfConst:
		return l.ConstKey
	case keyOfHeader:
		// A credential such as an API key: hashed, never kept in clear.
		if req == nil {
			return client
		}

		if v := req.Header[l.KeyHeader]; len(v) > 0 && strings.TrimSpace(v[0]) != "" {
			return request.HashKey(strings.TrimSpace(v[0]))
		}

		return client
	case keyOfHost:
		if req == nil {
			return client
		}

		return hostKey(req.Host, client)
	case keyOfParts:
		return partsKey(l, client, principal, req)
	}

	if principal != "" {
		return principal
	}

	return "ip:" + client
}

// The key of a KeyOfParts layer whose json: source the body does not state
// (request.BodyValue), and the separator of a composite key's values.
const (
	unknownKey  = "unknown"
	partsJoiner = "|"
)

// partsKey is the key of a layer keyed by a json: source or by several
// sources: each source's value as a layer keyed by it alone would have it
// (a json: value as it is, or hashed when longer than maxHostKeyLen),
// joined by "|", each with "%" and "|" escaped (as %25 and %7C), so that
// two different lists of values never make one key.
func partsKey(l *layer, client, principal string, req *http.Request) string {
	if req == nil {
		return client
	}

	key := ""
	for i, part := range l.KeyParts {
		v := ""
		switch part.Kind {
		case keyOfJSON:
			v = jsonKey(req, part.Path, l.MaxBody)
		case keyOfClient:
			v = client
		case keyOfHost:
			v = hostKey(req.Host, client)
		case keyOfHeader:
			v = client
			if h := req.Header[part.Header]; len(h) > 0 && strings.TrimSpace(h[0]) != "" {
				v = request.HashKey(strings.TrimSpace(h[0]))
			}
		default:
			v = "ip:" + client
			if principal != "" {
				v = principal
			}
		}

		if len(l.KeyParts) == 1 {
			return v
		}

		if i > 0 {
			key += partsJoiner
		}

		key += keyEscaper.Replace(v)
	}

	return key
}

// keyEscaper escapes a value of a composite key (partsKey).
var keyEscaper = strings.NewReplacer("%", "%25", partsJoiner, "%7C")

// jsonKey is the key of a json: source: the value at path in req's body,
// hashed when longer than maxHostKeyLen, or unknownKey when the body does
// not state one within max bytes.
func jsonKey(req *http.Request, path []string, max int64) string {
	v, ok := request.BodyValue(req, path, max)
	if !ok {
		return unknownKey
	}

	if len(v) > maxHostKeyLen {
		return request.HashKey(v)
	}

	return v
}

// route is a route limit with its matcher.
type route struct {
	layer   *layer
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
	charge      *layer
	// costFrom is where the response states what a request cost the
	// route's layer (nil: it charges cost up front), which holds reserve
	// points for the request until then (meter.go).
	costFrom *usage.Expr
	reserve  int64
	// loud is the layer of a costFrom route in dry run beside rules that
	// enforce (layer.Quiet), as its reservation's take charges it: the same
	// counters, shown, so that the take reports the window's reset, which
	// the settlement's give-back needs (reserveFor). nil for other routes.
	loud []*layer
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

func hasAnyPrefix(path string, prefixes []string) bool {
	for _, prefix := range prefixes {
		if strings.HasPrefix(path, prefix) {
			return true
		}
	}

	return false
}

// hostKey is the bucket key of a layer keyed by host: the request's host,
// without its port, in lower case, or client when the request has none.
func hostKey(host, client string) string {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}

	host = strings.ToLower(strings.TrimSuffix(strings.TrimSpace(host), "."))
	if host == "" {
		return client
	}

	if len(host) > maxHostKeyLen {
		return request.HashKey(host)
	}

	return "host:" + host
}

// isAsset reports whether the request's canonical path starts with an asset
// prefix. A path that p.assetHint (request.AssetHint) does not match is none.
func isAsset(p *Plugin, req *http.Request) bool {
	return p.assetHint != nil && p.assetHint.MatchString(req.URL.Path) && hasAnyPrefix(request.CanonicalPath(req.URL.Path, p.foldPaths), p.assetPaths)
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
