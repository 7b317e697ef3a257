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
// Only takeReserving, which metered requests alone reach, tests for items,
// and verdict writes them through reportTally (itemsBit): the other
// requests pay nothing for them (doc.go: frames).

// itemsBit marks, in tally.Firsts, a tally with items that allowed the
// request (reservedItem): verdict, which calls reportTally for any mark,
// writes its items then, so that a tally without items pays for none of it
// (doc.go: frames). The bits below it are layers' first refusals: a request
// of more layers than that gets no items (takeItems).
const itemsBit = uint64(1) << 62

// markBits are tally.Firsts's marks, not layers'.
const markBits = monthPolicyBit | itemsBit

// takeItems is take for the layers of charge pc, a metered request's
// others (takeReserving), on an instance with items (stores.items): the
// tally has items (tally.Each, one pair per layer of the whole request,
// whose first layers pc's are) when one of them is a concurrency layer.
func takeItems(st *stores, t *rule.Tally, pc *rule.Charge) {
	n := len(pc.Parent.Layers)
	for _, l := range pc.Layers {
		if l.Alg == algConcurrency && n < 62 {
			t.Each = make([]int64, 2*n) // rule.NewItems, without its frame
			takeEach(st, t, pc)

			return
		}
	}

	take(st, t, pc)
}

// reservedItem records the item of the reserving layer at i, whose take
// was part, in t, and marks t (itemsBit): takeReserving's, after its
// takes, which may write t anew (redisstore.TakeMixed).
func reservedItem(t *rule.Tally, i int, part *rule.Tally) {
	t.Each[2*i] = part.Left + 1 // a quiet layer's too, which setItems skips
	t.Each[2*i+1] = part.Reset
	t.Firsts |= itemsBit
}

// setItems appends to the RateLimit-Policy and RateLimit values that
// setHeaders wrote for tally t's shown layer the items of its other
// layers (t.Each, tally.Each): the policy from the layer's PolicyItem, the
// state from its RateItem and two numbers, one concatenation each (fewer
// temporaries than a buffer's appends). One frame, a month layer's policy
// in a function of its own: under Yaegi every call, operator and string
// concatenation costs allocations (doc.go: frames). reportTally calls it
// for verdict, whose tally shows a layer.
func setItems(p *Plugin, h http.Header, t *rule.Tally, c *rule.Charge) {
	if t.Refused { // a dry run's (c.All), whose answer names the refusal
		return
	}

	policy := h["Ratelimit-Policy"][0]
	rate := h["Ratelimit"][0]
	for i, l := range c.Layers {
		if i == t.Shown || t.Each[2*i] == 0 || l.Quiet {
			continue
		}

		policy += l.PolicyItem
		// An allowed layer has requests left, not fewer than none, and its
		// reset is ahead: neither number is negative.
		rate += l.RateItem + strconv.FormatInt(t.Each[2*i]-1, 10) + ";t=" + strconv.FormatInt((t.Each[2*i+1]-c.Now+(nsPerSecond-1))/nsPerSecond, 10)
	}

	h["Ratelimit-Policy"] = []string{policy}
	h["Ratelimit"] = []string{rate}
	if p.stores.month {
		rule.SetMonthItems(h, t, c) // a month layer's policy changes with the month
	}
}
