package tierlimit

import (
	"net/http"
	"strings"

	"github.com/tierlimit/tierlimit/config"
	"github.com/tierlimit/tierlimit/limit"
	"github.com/tierlimit/tierlimit/memstore"
	"github.com/tierlimit/tierlimit/redisstore"
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

// anyConcurrency reports whether a layer that is on is a concurrency layer.
func anyConcurrency(s *config.Settings) bool {
	for _, l := range config.Rules(s) {
		if l.On() && l.Algorithm == algConcurrency {
			return true
		}
	}

	return false
}

// releaseHeld frees the slots that the request of charge c holds in its
// concurrency layers, once it has been served: on Redis, the store's one
// give-back, which frees them in Redis and in its memory mirror alike.
func releaseHeld(p *Plugin, c *charge) {
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
	t := tally{Cost: requestCost}
	c := chargeOf(p.exempt.plan, client, principal, req, now, p.dryRun)
	take(p.stores, &t, c)

	if ok, _ := verdict(p, rw, req, &t, c); !ok {
		return
	}

	defer releaseHeld(p, c)

	p.next.ServeHTTP(rw, req)
}

// appendHeld is liveKeys' loop for a concurrency layer, under the store's
// lock: the keys holding slots in memory, their count the requests in
// flight, their reset the last lease's end, limited while every slot is
// held.
func appendHeld(out []liveKey, i int, l *layer, m map[string]*window, f *liveFilter) []liveKey {
	for key, w := range m {
		if w.List != l.List || (f.prefix != "" && !strings.HasPrefix(key, f.prefix)) {
			continue
		}

		held := heldAt(w, f.now)
		if held > 0 && (limit.Full(held, l.Points) || !f.limitedOnly) {
			out = append(out, liveKey{layer: i, key: key, count: held, reset: w.Expire, limited: limit.Full(held, l.Points), refused: w.Refused})
		}
	}

	return out
}

// heldAt is the slots of w whose lease runs at now.
func heldAt(w *window, now int64) int64 {
	n := int64(0)
	for _, end := range w.Slots {
		if end > now {
			n++
		}
	}

	return n
}

// inFlightMetrics writes the requests in flight that each concurrency
// layer counts in memory (the memory store, or a Redis instance's memory
// layers and fallback), summed over its keys; labels are the layers'.
func inFlightMetrics(p *Plugin, b *strings.Builder, labels []string, now int64) {
	if !p.held {
		return
	}

	family(b, "tierlimit_in_flight", "gauge", "Requests in flight that a concurrency layer counts in memory, over its keys.")

	s := p.memory
	for i, l := range p.layers {
		if l.Algorithm != algConcurrency {
			continue
		}

		total := int64(0)

		s.Mu.Lock()
		for _, w := range s.Maps[l.Name] {
			if w.List == l.List {
				total += heldAt(w, now)
			}
		}
		s.Mu.Unlock()

		sample(b, "tierlimit_in_flight", labels[i], formatInt(total))
	}
}
