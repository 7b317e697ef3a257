package tierlimit

import (
	"net/http"
	"strconv"

	"github.com/tierlimit/tierlimit/rule"
)

// The draft's fields (draft-ietf-httpapi-ratelimit-headers) are lists. An
// allowed request that a costFrom route or a concurrency layer charges (its
// client meters points, or the layer shown is its slots) gets every layer
// that allowed it in RateLimit-Policy and each one's state in RateLimit, in
// the same order: the layer X-RateLimit-* shows (the fewest left) first,
// then the others in the request's order (global, its tier, its routes), so
// that a client reading the first item alone reads what X-RateLimit-* says.
// Every other answer names one layer: a refusal the refusing one, other
// requests the one with the fewest left, as the fast paths (which serve
// neither kind of layer) do (docs/limits.md#responses).

// itemsFor is a tally's Each for a request charged to layers (tally.Each),
// or nil when none of them is a costFrom route's or a concurrency layer.
func itemsFor(layers []*layer) []int64 {
	if len(layers) < 2 {
		return nil
	}

	for _, l := range layers {
		if l.Settles || l.Algorithm == algConcurrency {
			return make([]int64, 2*len(layers)) // rule.NewItems, without its frame
		}
	}

	return nil
}

// setItems appends to the RateLimit-Policy and RateLimit values that
// setHeaders wrote for tally t's shown layer the items of its other
// layers (t.Each, tally.Each): the policy from the layer's PolicyItem, the
// state into one buffer. One frame with few temporaries, a month layer's
// policy in a function of its own: under Yaegi every call, operator and
// string concatenation costs allocations (doc.go: frames).
func setItems(p *Plugin, h http.Header, t *tally, c *charge) {
	if t.Refused {
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
