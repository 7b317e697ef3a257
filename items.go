package tierlimit

import (
	"net/http"

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
			return rule.NewItems(len(layers))
		}
	}

	return nil
}

// setItems appends to the RateLimit-Policy and RateLimit values that
// setHeaders wrote for tally t's shown layer the items of its other
// layers (t.Each, tally.Each). One string each, grown in place: under Yaegi
// every call and slice costs allocations (doc.go: frames).
func setItems(h http.Header, t *tally, c *charge) {
	policy := h["Ratelimit-Policy"][0]
	rate := h["Ratelimit"][0]
	if c.Layers[t.Shown].Month != nil {
		policy = rule.MonthPolicyAt(c.Layers[t.Shown], c.Now)[0]
	}

	more := false
	for i, l := range c.Layers {
		if i == t.Shown || t.Each[2*i] == 0 {
			continue
		}

		more = true
		secs := (t.Each[2*i+1] - c.Now + (nsPerSecond - 1)) / nsPerSecond
		if left := t.Each[2*i] - 1; left < l.TableLen && secs <= maxSmallInt && secs >= 0 && l.Month == nil {
			policy += ", " + l.PolicyHdr[0]
			rate += ", " + l.RatePrefix[left] + smallInts[secs]
		} else {
			policy, rate = appendLargeItem(policy, rate, l, left, secs, c.Now)
		}
	}

	if more {
		h["Ratelimit-Policy"] = []string{policy}
		h["Ratelimit"] = []string{rate}
	}
}

// appendLargeItem is setItems's item of layer l beyond its header table, or
// of a month layer, whose policy changes with the month (stores.month).
func appendLargeItem(policy, rate string, l *layer, left, secs, now int64) (string, string) {
	if l.Month != nil {
		policy += ", " + rule.MonthPolicyAt(l, now)[0]
	} else {
		policy += ", " + l.PolicyHdr[0]
	}

	if left < 0 {
		left = 0
	}

	if secs < 0 {
		secs = 0
	}

	return policy, rate + `, "` + l.Name + `";r=` + formatInt(left) + ";t=" + formatInt(secs)
}
