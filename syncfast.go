package tierlimit

import (
	"net/http"
	"strings"
)

// syncedPath is the handler of a modeRedis instance with redis.syncInterval
// (syncstore.go): the anonymous path, decided on the synced counters under
// their lock, as anonymousPath decides on the memory store's windows. A
// plan here is global and at most one more layer (TestFastPlansHoldTwoLayers),
// so a refusal gives back at most the one charge before it. A window's first
// refusal, a configured body and a WebSocket upgrade take syncTake and
// answer, which report and build the refusal; later refusals reuse the
// layer's refusal cache (under the synced counters' lock: this instance
// charges no memory window and keeps no block list).
type syncedPath Plugin

func (sp *syncedPath) ServeHTTP(rw http.ResponseWriter, req *http.Request) {
	p := (*Plugin)(sp)
	if p.status != nil && serveStatus(p, rw, req) {
		return
	}

	client := ""
	if req.Header["X-Forwarded-For"] == nil {
		i := strings.LastIndexByte(req.RemoteAddr, ':')
		if i > 0 && req.RemoteAddr[0] != '[' {
			client = req.RemoteAddr[:i]
		}
	}

	if client == "" {
		client = resolve(p.ips, req)
	}

	layers := p.planIP
	if p.assetHint != nil && p.assetHint.MatchString(req.URL.Path) && isAsset(p, req) {
		layers = p.planAssets
	}

	now := p.now().UnixNano()
	st := p.fast.store.synced

	var shown *layer
	var sc, fc *syncCounter
	var left int64

	st.mu.Lock()
	for _, l := range layers {
		key := client
		if l.keyKind == keyOfConst {
			key = l.constKey
		}

		c := st.byLayer[l.name][key]
		if c == nil || c.end <= now {
			c = syncRestart(st, l, key, now)
		}
		c.touched = true

		count := c.remote + c.inflight + c.pending
		if count >= l.points {
			refuseSynced(p, rw, req, layers, l, c, fc, client, now)
			return
		}

		c.pending++
		c.allowed++
		if shown == nil || l.points-count-1 < left {
			shown = l
			sc = c
			left = l.points - count - 1
		}
		fc = c
	}
	reset := sc.end
	resetH := sc.resetH
	st.mu.Unlock()

	h := rw.Header()
	h["X-Ratelimit-Limit"] = shown.limitHdr
	h["Ratelimit-Policy"] = shown.policyHdr
	h["X-Ratelimit-Reset"] = resetH
	secs := (reset - now + nsPerSecond - 1) / nsPerSecond
	if left < shown.tableLen && secs <= maxSmallInt {
		h["X-Ratelimit-Remaining"] = shown.remainingHdr[left]
		h["Ratelimit"] = []string{shown.ratePrefix[left] + smallInts[secs]}
	} else {
		setLargeHeaders(h, shown, left, secs)
	}

	p.next.ServeHTTP(rw, req)
}

// refuseSynced answers a request that layer l refused on counter c, after
// giving the layer charged before it (counter fc) its point back; as in
// refuseFast, fc's allowed count keeps its decision. It is called with the
// synced counters locked and unlocks them.
func refuseSynced(p *Plugin, rw http.ResponseWriter, req *http.Request, layers []*layer, l *layer, c, fc *syncCounter, client string, now int64) {
	st := p.fast.store.synced
	if fc != nil {
		fc.pending--
	}

	if l.body != nil || req.Header["Upgrade"] != nil || !c.logged {
		// syncTake counts the decision again, fc's allowed too.
		if fc != nil {
			fc.allowed--
		}

		st.mu.Unlock()

		var t tally
		syncTake(st, &t, now, layers, client, "", req, false)
		answer(p, rw, req, layers, &t, client, now)

		return
	}

	c.refused++

	cache := &l.cache
	secs := (c.end - now + nsPerSecond - 1) / nsPerSecond
	if cache.resetSec != ceilSeconds(c.end) || cache.secs != secs {
		cacheRefusal(l, c.resetH[0], c.end, secs)
	}

	values := cache.values
	body := cache.body
	st.mu.Unlock()

	h := rw.Header()
	for i, v := range values {
		h[refusalHeaders[i]] = v
	}

	rw.WriteHeader(l.status)
	_, _ = rw.Write(body)
}
