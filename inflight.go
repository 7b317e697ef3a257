package tierlimit

import (
	"net/http"

	"github.com/tierlimit/tierlimit/memstore"
	"github.com/tierlimit/tierlimit/redisstore"
	"github.com/tierlimit/tierlimit/rule"
)

// Concurrency layers (algorithm: concurrency, config/concurrency.go): a
// request admitted holds one slot of each for as long as it is in flight,
// and gives them back when next has ended, which for a proxied request is
// when its response has ended or its client went away (the proxy then
// panics with http.ErrAbortHandler: the release is deferred), for a
// WebSocket upgrade when the connection closes. The lease (the layer's
// duration) bounds what a request that never returns, or a replica that died
// holding slots in Redis, can hold. chooseMode sends an instance with such a
// layer to serveGeneral, which releases them (releaseHeld); the fast paths
// never see one.

// releaseHeld frees the slots that the request of charge c holds in its
// concurrency layers, once it has been served: on Redis, the store's one
// give-back, which frees them in Redis and in its memory mirror alike.
func releaseHeld(p *Plugin, c *rule.Charge) {
	if p.stores.redis == nil {
		memstore.Release(p.stores.memory, c)
		return
	}

	redisstore.GiveBack(p.stores.redis, c, 0, true)
}

// serveExemptHeld is serveExempt on an instance with concurrency layers:
// the global layer an exempt request pays may be one, whose slot it holds
// until it has been served.
func serveExemptHeld(p *Plugin, rw http.ResponseWriter, req *http.Request, client, principal string) {
	now := p.now().UnixNano()
	t := rule.Tally{Cost: requestCost}
	c := chargeOf(p.exempt.plan, client, principal, req, now, p.dryRun)
	take(p.stores, &t, c)

	if ok, _ := verdict(p, rw, req, &t, c); !ok {
		return
	}

	defer releaseHeld(p, c)

	p.next.ServeHTTP(rw, req)
}
