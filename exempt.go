package tierlimit

import (
	"net/http"
)

// isExempt reports whether exempt.ips holds the request's client address or
// exempt.principals its principal. The address is the one the limiter keys
// on (trusted proxies and hops applied), before any IPv6 prefix is taken.
func (p *Plugin) isExempt(req *http.Request, principal string) bool {
	if principal != "" && p.cfg.exemptIDs[principal] {
		return true
	}

	if len(p.cfg.exemptIPs) == 0 {
		return false
	}

	a, ok := p.ips.clientAddr(req.RemoteAddr, req.Header["X-Forwarded-For"])
	if !ok {
		return false
	}

	for _, prefix := range p.cfg.exemptIPs {
		if prefix.Contains(a) {
			return true
		}
	}

	return false
}

// serveExempt passes on an exempt request. No tier, route or connection cap
// charges it; the global layer does unless exempt.global is set, since the
// global budget protects the backend from everyone, exempt clients included.
// With no layer charged the response carries no rate-limit headers: no limit
// applies to it.
func (p *Plugin) serveExempt(rw http.ResponseWriter, req *http.Request, client, principal string) {
	if p.planExempt != nil {
		if ok, _ := p.decide(rw, req, p.planExempt, client, principal); !ok {
			return
		}
	}

	p.next.ServeHTTP(rw, req)
}
