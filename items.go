package tierlimit

import (
	"net/http"
	"strconv"

	"github.com/tierlimit/tierlimit/rule"
)

// The draft's fields (draft-ietf-httpapi-ratelimit-headers) are lists. An
// allowed request that a costFrom route and a concurrency layer both charge
// (its client meters tokens, and its slots, the fewest left while a request
// is in flight, would be shown alone) gets every layer that allowed it in
// RateLimit-Policy and each one's state in RateLimit, in the same order:
// the layer X-RateLimit-* shows (the fewest left) first, then the others in
// the request's order (global, its tier, its routes), so that a client
// reading the first item alone reads what X-RateLimit-* says. Every other
// answer names one layer: a refusal the refusing one, other requests the
// one with the fewest left, as the fast paths do (docs/limits.md#responses).
// Only takeReserving and serveCounted, which metered requests alone reach,
// test for items: the other requests pay nothing for them (doc.go: frames).

// itemsFor gives tally t its items (tally.Each) when one of charge c's
// layers is a concurrency layer, and hands t to serveCounted in hits:
// takeReserving asks for a request that a costFrom route charges.
func itemsFor(t *tally, c *charge, hits *routeHits) {
	for _, l := range c.Layers {
		if l.Algorithm == algConcurrency {
			t.Each = make([]int64, 2*len(c.Layers)) // rule.NewItems, without its frame
			hits.items = t

			return
		}
	}
}

// setItems appends to the RateLimit-Policy and RateLimit values that
// setHeaders wrote for tally t's shown layer the items of its other
// layers (t.Each, tally.Each): the policy from the layer's PolicyItem, the
// state into one buffer. One frame with few temporaries, a month layer's
// policy in a function of its own: under Yaegi every call, operator and
// string concatenation costs allocations (doc.go: frames).
func setItems(p *Plugin, h http.Header, t *tally, c *charge) {
	if t.Refused || t.Shown < 0 {
		return
	}

	policy := h["Ratelimit-Policy"][0]
	b := append(make([]byte, 0, 160), h["Ratelimit"][0]...)
	for i, l := range c.Layers {
		if i == t.Shown || t.Each[2*i] == 0 || l.Quiet {
			continue
		}

		policy += l.PolicyItem
		// An allowed layer has requests left, not fewer than none, and its
		// reset is ahead: neither number is negative.
		b = strconv.AppendInt(append(b, l.RateItem...), t.Each[2*i]-1, 10)
		b = strconv.AppendInt(append(b, ";t="...), (t.Each[2*i+1]-c.Now+(nsPerSecond-1))/nsPerSecond, 10)
	}

	h["Ratelimit-Policy"] = []string{policy}
	h["Ratelimit"] = []string{string(b)}
	if p.stores.month {
		rule.SetMonthItems(h, t, c) // a month layer's policy changes with the month
	}
}
