package tierlimit

import (
	"strconv"
	"sync/atomic"

	"github.com/tierlimit/tierlimit/limit"
	"github.com/tierlimit/tierlimit/rule"
	"github.com/tierlimit/tierlimit/usage"
)

// A costFrom route (a metered API: an LLM's tokens) charges its own layer
// what the response says the request cost, which is known only when the
// response ends. Until then the request holds the route's reserve points
// in that layer: it is admitted only when they fit (all or nothing with
// its other layers, which charge the request's cost as usual:
// takeReserving), and when the response ends the reservation is replaced
// by the reported cost (settleReservations): the difference is given back
// (refund) or charged past the layer's points if need be (spend), so
// requests in flight overspend by at most what each reports beyond its
// reservation. Until then what the layer holds only rises (holdStated). A
// response ends however its request does, the proxy's abort when the
// client hangs up and other panics included (serveCounted defers the
// settlement). A response that reports nothing leaves the reservation
// charged, with one event per layer and window.

// reservation is what a request admitted by a costFrom route holds in the
// route's layer until its response ends.
type reservation struct {
	rt     *route
	key    string // the layer's key for the request
	client string
	// reset is when the layer's window of the admission ends: a give-back
	// after it would go to a window that never held the reservation. 0 for a
	// token bucket, whose debt carries over.
	reset  int64
	reader *usage.Reader // a json: source's, from the response's header on
	// held is what the layer holds for the request: its reserve, raised to
	// each larger cost its event stream states (readBody), then what the
	// response reported.
	held    int64
	streams bool // the body is an event stream, whose events may raise held
}

// maxReportedCost bounds what a response may charge: more than any API
// bills for one request, and far from int64 overflow in a token bucket's
// arithmetic.
const maxReportedCost = int64(1) << 40

// takeReserving is take for a request that matched costFrom routes
// (hits.metered, whose layers end c, in that order): each of those layers
// is charged its route's reserve, every other layer t.Cost. The other
// layers are taken first, then each reserving layer in a take of its own,
// all or nothing: a refusal gives the earlier takes their points back, as
// redisstore.TakeMixed does across stores. What it reserves goes to hits.reserved.
// The reserving layers are marked in t.Uncharged: a pending ip charge that
// refuses the request later (after.go settle) leaves them to the
// settlement, which gives their reservation back.
func takeReserving(st *stores, t *rule.Tally, c *rule.Charge, hits *routeHits) {
	n := len(c.Layers) - len(hits.metered)
	t.Shown = -1

	if n > 0 {
		if st.items {
			takeItems(st, t, rule.ChargeSpan(c, 0, n))
		} else {
			take(st, t, rule.ChargeSpan(c, 0, n))
		}
		if t.Refused && !c.All {
			return
		}
	}

	for j, rt := range hits.metered {
		i := n + j
		part := rule.Tally{Cost: rt.reserve}
		pc := rule.ChargeSpan(c, i, i+1)
		if rt.loud != nil {
			takeQuiet(st, &part, pc, rt.loud)
		} else {
			take(st, &part, pc)
		}
		t.Firsts |= part.Firsts << uint(i)
		t.Uncharged |= uint64(1) << uint(i)

		if part.Refused && !c.All {
			refuseReserved(st, t, c, hits, &part, i)
			return
		}

		hits.reserved = append(hits.reserved, reserveFor(rt, pc, &part))

		// One value at a time (doc.go: frames); which layer the headers show
		// is limit's decision (FewerLeft), not restated here.
		if part.Shown == 0 && !t.Refused && (t.Shown < 0 || limit.FewerLeft(part.Left, t.Left)) {
			t.Shown = i
			t.Count = part.Count
			t.Reset = part.Reset
			t.ResetH = part.ResetH
			t.Left = part.Left
		}
		if t.Each != nil {
			reservedItem(t, i, &part)
		}
	}
}

// refuseReserved makes t the refusal of the reserving layer at i of c,
// whose take was part, after giving back what the request's takes charged
// before (giveBackReserved).
func refuseReserved(st *stores, t *rule.Tally, c *rule.Charge, hits *routeHits, part *rule.Tally, i int) {
	giveBackReserved(st, c, t, hits, i)

	t.Shown = i
	t.Count = part.Count
	t.Reset = part.Reset
	t.ResetH = part.ResetH
	t.Left = 0
	t.Refused = true
}

// giveBackReserved refunds what a request's takes charged before the
// reserving layer at i refused it: the other layers (c's first n, but those
// the take left uncharged and the check-only ones) and the reservations
// made so far.
func giveBackReserved(st *stores, c *rule.Charge, t *rule.Tally, hits *routeHits, i int) {
	n := len(c.Layers) - len(hits.metered)
	if n > 0 {
		rest := rule.ChargeSpan(c, 0, n)
		refund(st, rule.ChargeWithout(rest, t.Uncharged&(uint64(1)<<uint(n)-1)|rule.CheckOnlyBits(rest.Layers)), rule.CostOf(t))
	}

	for j := n; j < i; j++ {
		rt := hits.metered[j-n]
		refund(st, rule.ChargeSpan(c, j, j+1), rt.reserve)
		atomic.AddInt64(&rt.layer.Stats.Reserved, -1)
	}

	hits.reserved = nil
}

// takeQuiet is take for the reservation of a quiet costFrom layer (a dry
// run beside rules that enforce), charge pc its layer alone, loud the
// layer's loud copy (route.loud): the take charges the same counters and
// reports the window's reset, which the headers never show (t.Shown -1).
func takeQuiet(st *stores, t *rule.Tally, pc *rule.Charge, loud []*rule.Layer) {
	pc.Layers = loud
	take(st, t, pc)
	t.Shown = -1
}

// reserveFor is the reservation that the take of part t, charge pc (a
// costFrom route's layer alone), made for route rt: t's reset is the
// layer's window's (takeQuiet's too).
func reserveFor(rt *route, pc *rule.Charge, t *rule.Tally) reservation {
	r := reservation{rt: rt, key: pc.Keys[0], client: pc.Client, held: rt.reserve}
	atomic.AddInt64(&rt.layer.Stats.Reserved, 1)

	if rt.layer.Alg != algTokenBucket {
		r.reset = t.Reset
	}

	return r
}

// settleReservations replaces the reservations of a request whose
// response has ended (w's) with what the response reported: a cost below
// what the layer holds gives the difference back while the admission's
// window lasts; one above it is charged past the layer's points if need
// be; none leaves the reservation charged. A response the plugin replaced
// by a 429 (w.discard) cost nothing. Once settled, a request is not again.
func settleReservations(w *watchWriter) {
	if w.settled {
		return
	}

	w.settled = true
	p := w.p
	now := p.now().UnixNano()

	for i := range w.reserved {
		r := &w.reserved[i]
		atomic.AddInt64(&r.rt.layer.Stats.Reserved, -1)

		cost, ok := int64(0), true
		switch {
		case w.discard:
		case r.rt.costFrom.Header != "":
			cost, ok = usage.HeaderCost(w.rw.Header(), r.rt.costFrom.Header)
		default:
			cost, ok = bodyCost(r)
		}

		if !ok {
			unreported(p, r, now)
			continue
		}

		holdCost(p, r, cost, now)
		atomic.AddInt64(&r.rt.layer.Stats.Settled, r.held)
	}
}

// holdCost makes what r's layer holds for its request cost (at most
// maxReportedCost): the difference is given back while the admission's
// window lasts, or charged past the layer's points if need be.
func holdCost(p *Plugin, r *reservation, cost, now int64) {
	if cost > maxReportedCost {
		cost = maxReportedCost
	}

	delta := cost - r.held
	r.held = cost

	c := &rule.Charge{Layers: []*rule.Layer{r.rt.layer}, Keys: []string{r.key}, Client: r.client, Now: now}

	switch {
	case delta < 0 && (r.reset == 0 || now < r.reset):
		refund(p.stores, c, -delta)
	case delta > 0:
		spend(p.stores, c, delta)
	}
}

// bodyCost is the cost r's response's body states at r's route's
// costFrom (a json: source); usage.HeaderCost reads a header's.
func bodyCost(r *reservation) (int64, bool) {
	if r.reader == nil {
		return 0, false
	}

	return usage.Result(r.reader)
}

// unreported counts a response that stated no cost, and writes an event
// for the first of its layer's window.
func unreported(p *Plugin, r *reservation, now int64) {
	l := r.rt.layer
	st := l.Stats
	atomic.AddInt64(&st.Unreported, 1)

	window := now / l.Duration
	if old := atomic.LoadInt64(&st.UnreportedWindow); old != window && atomic.CompareAndSwapInt64(&st.UnreportedWindow, old, window) {
		p.events.CostUnreported(l.Name, r.key, r.client, r.rt.costFrom.Spec, r.rt.reserve)
	}
}

// startReading makes the body readers of w's reservations, once the
// response's header is known. A response whose Content-Length announces no
// body is settled at once, before the client has its header.
func startReading(w *watchWriter) {
	h := w.rw.Header()

	for i := range w.reserved {
		if src := w.reserved[i].rt.costFrom; src.Header == "" {
			w.reserved[i].reader = usage.Open(src, h)
			// Only a stream states a cost before it ends.
			w.reserved[i].streams = usage.Streams(w.reserved[i].reader)
		}
	}

	w.bodyLeft = -1
	if v := h["Content-Length"]; len(v) == 1 {
		if n, err := strconv.ParseInt(v[0], 10, 64); err == nil && n >= 0 {
			w.bodyLeft = n
		}
	}

	if w.bodyLeft == 0 {
		settleReservations(w)
	}
}

// readBody hands a chunk of the response body to w's readers, before it is
// written: the chunk that ends a body of known length settles the
// reservations first, so that a client that has read the whole body finds
// them settled. A body without a length (chunked, an event stream) ends
// after the handler has returned, which settles them (serveCounted).
func readBody(w *watchWriter, b []byte) {
	for i := range w.reserved {
		if r := &w.reserved[i]; r.reader != nil {
			usage.Feed(r.reader, b)
			if r.streams {
				holdStated(w.p, r)
			}
		}
	}

	if w.bodyLeft < 0 {
		return
	}

	w.bodyLeft -= int64(len(b))
	if w.bodyLeft <= 0 {
		settleReservations(w)
	}
}

// holdStated raises what r's layer holds for its request to the cost its
// event stream states so far, as soon as the event that states it is read
// and before the client has it, when that cost is larger: a client that
// stops at the stream's last event ("data: [DONE]") and sends its next
// request finds it charged, and requests in flight never hold less than
// they may cost. A smaller cost lowers nothing before the response ends
// (settleReservations): a stream that states its cumulative usage in every
// event (vLLM's continuous_usage_stats) states small costs first, and
// holding those would let more requests in than the points allow. So a
// store call is made per event that states more than is held, none for
// the others.
func holdStated(p *Plugin, r *reservation) {
	cost, ok := usage.Stated(r.reader)
	if !ok || cost <= r.held {
		return
	}

	holdCost(p, r, cost, p.now().UnixNano())
}
