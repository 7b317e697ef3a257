package tierlimit

import (
	"net/http"

	"github.com/tierlimit/tierlimit/request"
)

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
	if p.exempt.plan != nil {
		if ok, _ := decide(p, rw, req, p.exempt.plan, client, principal, requestCost); !ok {
			return
		}
	}

	p.next.ServeHTTP(rw, req)
}
