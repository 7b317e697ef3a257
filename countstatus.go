package tierlimit

import (
	"net/http"

	"github.com/tierlimit/tierlimit/limit"
)

// A route with countStatus (a login limit that counts failed logins only) is
// charged after the response, and only when its status is listed. Up front
// its layer is check-only (layer.checkOnly): the request is refused when the
// route's budget for its key cannot take its cost, and otherwise charged
// nothing there, while the other layers of its plan charge as usual, all or
// nothing among themselves. Once the response's status is known, a listed
// one is charged to the route's charging layer (route.charge: the same
// counters) with the request's cost, in a take of its own that stops at a
// refusal: requests in flight when the budget runs out are each counted
// while they fit, and the count never exceeds the points, so the route
// refuses no longer than its rule says. A charge that no longer fits is
// counted as a refusal of the layer in its statistics; the response passes
// unchanged either way.

// routeHits is what the matching routes of a request add to its charge: the
// largest cost among them (0: none matched), and those that count only
// listed statuses.
type routeHits struct {
	cost    int64
	counted []*route
}

// check evaluates the check-only layer l under s.mu for a request of cost
// points, as take would charge it, and records it in t as layers[i]: a
// refusal like any other, an allowance with the layer's count as it is
// (nothing spent). It writes no count and makes no counter: only refusal
// statistics, and a sliding window's move to its next window, which every
// later charge would make the same.
func (s *windowStore) check(t *tally, i int, now int64, l *layer, key string, cost int64) bool {
	w := l.Entries[key]
	if w != nil && w.List != l.List {
		w = nil
	}

	switch {
	case l.Sliding:
		return checkSliding(t, i, now, l, w, cost)
	case l.Interval != 0:
		return checkBucket(t, i, now, l, w, cost)
	}

	count := int64(0)
	reset := now + l.Duration
	var resetH []string

	if w != nil && w.Reset > now {
		count = w.Count
		reset = w.Reset
		resetH = w.ResetH
	} else {
		w = nil
	}

	if count+cost > l.Points {
		return checkRefused(t, i, l, w, count+cost, reset, resetH)
	}

	if resetH == nil {
		resetH = []string{formatInt(limit.CeilSeconds(reset))}
	}

	t.Allow(i, l, count, reset, resetH)

	return false
}

// checkSliding is check for a sliding layer (slide's arithmetic).
func checkSliding(t *tally, i int, now int64, l *layer, w *window, cost int64) bool {
	if w == nil || w.Expire <= now {
		reset := now + l.Duration
		t.Allow(i, l, 0, reset, []string{formatInt(limit.CeilSeconds(reset))})

		return false
	}

	if w.Reset <= now {
		rotate(w, l)
	}

	left := w.Reset - now
	est := slidingCount(w.PrevCount, w.Count, cost, left, l.Duration)

	if est > l.Points {
		retry := now + slidingWait(w.PrevCount, w.Count, cost, l.Points, left, l.Duration)
		return checkRefused(t, i, l, w, est, retry, []string{formatInt(limit.CeilSeconds(retry))})
	}

	t.Allow(i, l, est-cost, w.Reset, w.ResetH)

	return false
}

// checkBucket is check for a token bucket (drip's arithmetic).
func checkBucket(t *tally, i int, now int64, l *layer, w *window, cost int64) bool {
	tat := now
	if w != nil && w.Reset > now {
		tat = w.Reset
	}

	if tat-now > (l.Points-cost)*l.Interval {
		retry := tat - (l.Points-cost)*l.Interval
		return checkRefused(t, i, l, w, l.Points+1, retry, []string{formatInt(limit.CeilSeconds(retry))})
	}

	t.Allow(i, l, bucketUsed(tat-now, l.Interval), tat, []string{formatInt(limit.CeilSeconds(tat))})

	return false
}

// checkRefused records a refusal of a check-only layer (window w, or nil
// when the key has none) and reports whether it refuses the request (not
// in dry run).
func checkRefused(t *tally, i int, l *layer, w *window, count, reset int64, resetH []string) bool {
	l.Stats.Refused++

	first := false
	if w != nil {
		w.Refused++
		first = !w.Logged
		w.Logged = true
	}

	if resetH == nil {
		resetH = []string{formatInt(limit.CeilSeconds(reset))}
	}

	return t.RefuseAs(i, l, count, reset, resetH, first)
}

// serveCounted passes on a request that matched countStatus routes with its
// response watched: out is what next would get otherwise (rw, or the
// watchWriter of a credentialed request, which then watches for both,
// around the original writer, to which serveUpgrade writes its refusals);
// c is the request's charge, whose client and principal key the routes.
// left is what the headers show (-1: none).
func serveCounted(p *Plugin, out http.ResponseWriter, req *http.Request, c *charge, hits *routeHits, left int64) {
	ww, ok := out.(*watchWriter)
	if !ok {
		ww = &watchWriter{rw: out, req: req, p: p, prevLeft: left}
	}
	ww.routes = hits.counted
	ww.client = c.Client
	ww.principal = c.Principal
	ww.cost = hits.cost

	// Converted to the interface first (doc.go: wrappers).
	var w http.ResponseWriter = ww
	if p.ws != nil && isUpgrade(req) {
		serveUpgrade(p, w, ww.rw, req, c.Client)
	} else {
		p.next.ServeHTTP(w, req)
	}

	// A handler that wrote nothing answered 200, which net/http sends.
	if !ww.wroteHeader {
		ww.wroteHeader = true
		ww.count(http.StatusOK)
	}
}

// count charges the routes that list code, and shows the charge in the
// headers when it leaves fewer requests than they show.
func (w *watchWriter) count(code int) {
	var layers []*layer

	for _, rt := range w.routes {
		if rt.countStatus[code] {
			layers = append(layers, rt.charge)
		}
	}

	if layers == nil {
		return
	}

	p := w.p
	now := p.now().UnixNano()
	t := tally{Cost: w.cost}

	c := chargeOf(layers, w.client, w.principal, w.req, now, p.dryRun)
	p.store.take(&t, c)

	if p.headers && t.Shown >= 0 && (w.prevLeft < 0 || t.Left < w.prevLeft) {
		setHeaders(w.rw.Header(), layers[t.Shown], t.Left, t.Reset, t.ResetH, now)
	}

	// After the headers, which a month layer's mark corrects (monthStore).
	if t.Firsts != 0 {
		reportTally(p, w.rw, &t, c)
	}
}
