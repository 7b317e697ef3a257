package tierlimit

import (
	"net/http"
	"strings"

	"github.com/tierlimit/tierlimit/config"
	"github.com/tierlimit/tierlimit/memstore"
	"github.com/tierlimit/tierlimit/redisstore"
	"github.com/tierlimit/tierlimit/rule"
	"github.com/tierlimit/tierlimit/status"
)

// The status endpoint (status.path) is package status; here is what the
// request path asks it and what New hands it.

// serveStatus answers the request if it is for the status endpoint from an
// allowed client and reports whether it did. Called only when status.path is
// set; the path is compared first, in a frame of its own, so that other
// requests cost one string prefix test (doc.go: frames).
func serveStatus(p *Plugin, rw http.ResponseWriter, req *http.Request) bool {
	return strings.HasPrefix(req.URL.Path, p.status.Path) && serveStatusPage(p, rw, req)
}

// serveStatusPage is serveStatus for a request whose path starts with
// status.path: the selectors of status.Serve's arguments are temporaries
// every request's frame would hold.
func serveStatusPage(p *Plugin, rw http.ResponseWriter, req *http.Request) bool {
	return status.Serve(p.status, rw, req, p.now)
}

// statusPageOf is the instance as the status endpoint reads it, once its
// layers, routes and stores are built.
func statusPageOf(p *Plugin, cfg *config.Settings) *status.Page {
	pg := &status.Page{
		Path: cfg.StatusPath, Allowed: cfg.StatusAllowed, Store: cfg.Store,
		Name: p.name, IPs: p.ips, Events: p.events,
		Layers: p.layers, Memory: p.memory, Redis: p.stores.redis, Meters: make([]*status.Meter, len(p.layers)), Held: p.held,
		Registries: []status.Registry{{Name: "stores", Entries: memstore.Stores}, {Name: "blocklists", Entries: redisstore.BlockLists},
			{Name: "connections", Entries: connCounters.byName}},
	}

	for i, l := range p.layers {
		if rt := meteredRouteOf(p, l); rt != nil {
			pg.Meters[i] = &status.Meter{Source: rt.costFrom.Spec, Reserve: rt.reserve}
		}
	}

	return pg
}

// meteredRouteOf is the costFrom route (or route plan) whose layer is l;
// nil when none is.
func meteredRouteOf(p *Plugin, l *rule.Layer) *route {
	if !l.Settles {
		return nil
	}

	for _, rt := range allRoutes(p.routes) {
		if rt.layer == l {
			return rt
		}
	}

	return nil
}
