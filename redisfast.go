package tierlimit

import (
	"errors"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/tierlimit/tierlimit/redisresp"
)

// The Redis fast path serves modeRedis. chooseMode guarantees it what
// modeAnonymous has (headers on, no dry run, fixed windows, no principal, no
// credential, no route, no connection cap, no exemption), with the Redis
// store on one server or a Sentinel's primary (no Cluster) instead of
// memory, and an ip
// layer keyed by the client on every plan (assets too, when asset prefixes
// apply): each plan charges global (when on) and one layer keyed by the
// client. So the script call of a plan is encoded once but for the client's
// key (redisPlan), and the common request, every layer allowed with Redis
// healthy and none of its keys blocked, is served here. Every other case
// takes the Redis store's own code (redisstore.go): a blocked key is refused
// by refuseBlocked, Redis in back-off decided by serveRedisSlow, a failed
// call by redisFailed, a refusal or a reply the fast path does not accept by
// redisReply.

// redisFast is what redisPath reads: the store and the plans' calls.
type redisFast struct {
	store  *redisStore
	ip     *redisPlan
	assets *redisPlan // nil without asset prefixes
}

// redisPlan is the script call of a plan: the command is heads[len(client)]
// + client + tail.
type redisPlan struct {
	call  redisresp.Call
	heads []string // the call's head, the keys before the client's, and its length and prefix
	tail  string   // the end of the client's key, the keys after it, the arguments
}

// maxFastClientKey bounds the client keys whose call head is encoded once:
// an IPv6 address with its prefix length takes at most 43 bytes. Longer
// keys are served by serveRedisSlow.
const maxFastClientKey = 64

// newRedisFast encodes the calls of the plans of a modeRedis instance.
func newRedisFast(rs *redisStore, ps plans) *redisFast {
	f := &redisFast{store: rs, ip: newRedisPlan(rs, ps.planIP, 1)}
	if ps.planAssets != nil {
		f.assets = newRedisPlan(rs, ps.planAssets, 1)
	}

	return f
}

// newRedisPlan encodes the call of a plan with one layer keyed by the client
// as encodeCall encodes it, but for ARGV[1]: "2", the one-integer reply; each
// request costs cost.
func newRedisPlan(rs *redisStore, layers []*layer, cost int64) *redisPlan {
	rp := &redisPlan{call: rs.callFor(len(layers))}
	front, key, tail, args := rp.call.Head(), "", "", argOneInteger+costArg(cost)
	seen := false

	for _, l := range layers {
		args += l.redisArgs

		switch {
		case l.keyKind != keyOfConst:
			key = l.redisKey
			tail = "\r\n"
			seen = true
		case seen:
			tail += l.redisConstKey
		default:
			front += l.redisConstKey
		}
	}

	rp.tail = tail + args

	for n := 0; n < maxFastClientKey; n++ {
		rp.heads = append(rp.heads, front+"$"+strconv.Itoa(len(key)+n)+"\r\n"+key)
	}

	return rp
}

// redisFastEligible tells chooseMode whether an instance that would
// otherwise take the general path meets what redisPath needs (see the
// top of this file).
func redisFastEligible(s *settings, fixed, routes bool) bool {
	p := s.principal

	return s.store == "redis" && s.redis.Cluster == nil &&
		s.headers && !s.dryRun && fixed && !routes && s.wsMaxPerIP == 0 &&
		p.UserHeader == "" && len(p.CredentialHeaders)+len(p.CredentialCookies)+len(p.CredentialQueryParams) == 0 &&
		len(s.exemptIPs)+len(s.exemptIDs) == 0 &&
		s.ip.on() && (s.assets.on() || len(s.assetPaths) == 0)
}

// redisPath is the handler of modeRedis (see fast.go's handlers).
type redisPath Plugin

// ServeHTTP is the anonymous path on the Redis store: one script call
// charges the plan, and the headers are those of the layer with the fewest
// left.
func (rd *redisPath) ServeHTTP(rw http.ResponseWriter, req *http.Request) {
	p := (*Plugin)(rd)
	if p.status != nil && serveStatus(p, rw, req) {
		return
	}
	client := ""
	// kernel client-ip (p.ips as r)
	if req.Header["X-Forwarded-For"] == nil {
		i := strings.LastIndexByte(req.RemoteAddr, ':')
		if i > 0 && req.RemoteAddr[0] != '[' {
			client = req.RemoteAddr[:i]
		}
	}
	if client == "" {
		client = resolve(p.ips, req)
	}
	// end kernel
	layers := p.planIP
	rp := p.fast.ip
	if p.assetHint != nil && p.assetHint.MatchString(req.URL.Path) && isAsset(p, req) {
		layers = p.planAssets
		rp = p.fast.assets
	}

	rs := p.fast.store
	if rs.blocked.size.Load() != 0 && refuseBlocked(p, rw, req, layers, client) {
		return
	}

	if rs.backend.down.Load() || len(client) >= maxFastClientKey {
		serveRedisSlow(p, rw, req, layers, client)
		return
	}

	now := p.now().UnixNano()
	v, ints, err := redisresp.ScriptInts(rs.backend.single, rs.backend.sentinel, rp.call, rp.heads[len(client)]+client+rp.tail)
	if err != nil {
		redisFailed(p, rw, req, layers, client, now, err)
		return
	}

	// Every layer allowed: one integer, (left x (window + 1) + reset) x 16 +
	// the index of the layer to show (takeScript). An array, a refusal among
	// them, is redisReply's.
	i := v % 16
	if ints != nil || i >= int64(len(layers)) {
		redisReply(p, rw, req, layers, client, now, ints)
		return
	}
	shown := layers[i]
	ttl := v / 16 % (shown.maxTTL + 1)
	left := v / 16 / (shown.maxTTL + 1)
	if left >= shown.points {
		redisReply(p, rw, req, layers, client, now, []int64{v})
		return
	}

	for _, l := range layers {
		atomic.AddInt64(&l.stats.redisAllowed, 1)
	}

	reset := now + ttl*nsPerMillisecond
	resetH := []string{strconv.FormatInt((reset+nsPerSecond-1)/nsPerSecond, 10)}
	h := rw.Header()
	// kernel headers
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
	// end kernel

	p.next.ServeHTTP(rw, req)
}

// nsPerMillisecond is int64(time.Millisecond) as an untyped constant (see
// nsPerSecond).
const nsPerMillisecond = 1000000

// refuseBlocked refuses, without a Redis call, a request one of whose keys
// Redis reported over its limit (the store's block list), and reports
// whether it did. As refuseFast does, it answers from the layer's refusal
// cache, under the block list's lock (modeRedis charges no memory window);
// the refusal was reported when the key was blocked. An expired entry, a
// configured body or a WebSocket upgrade takes the store's own code
// (refuseBlockedGeneral).
func refuseBlocked(p *Plugin, rw http.ResponseWriter, req *http.Request, layers []*layer, client string) bool {
	b := p.fast.store.blocked
	now := p.now().UnixNano()
	b.mu.Lock()
	for _, l := range layers {
		key := client
		if l.keyKind == keyOfConst {
			key = l.constKey
		}
		reset := b.until[l.blockPrefix+key]
		if reset == 0 {
			continue
		}
		if reset <= now || l.body != nil || req.Header["Upgrade"] != nil {
			b.mu.Unlock()
			return refuseBlockedGeneral(p, rw, req, layers, client, now)
		}

		c := &l.cache
		resetSec := (reset + nsPerSecond - 1) / nsPerSecond
		secs := (reset - now + nsPerSecond - 1) / nsPerSecond
		if c.resetSec != resetSec || c.secs != secs {
			c.set(l, formatInt(resetSec), reset, secs)
		}
		values := c.values
		body := c.body
		b.mu.Unlock()

		atomic.AddInt64(&l.stats.redisRefused, 1)
		h := rw.Header()
		// kernel cached-refusal
		for i, v := range values {
			h[refusalHeaders[i]] = v
		}
		rw.WriteHeader(l.status)
		_, _ = rw.Write(body)
		// end kernel

		return true
	}
	b.mu.Unlock()

	return false
}

// refuseBlockedGeneral is refuseBlocked through the store's takeBlocked.
func refuseBlockedGeneral(p *Plugin, rw http.ResponseWriter, req *http.Request, layers []*layer, client string, now int64) bool {
	var t tally

	if !p.fast.store.takeBlocked(&t, now, layers, client, "", req) {
		return false
	}

	answer(p, rw, req, layers, &t, client, now)

	return true
}

// serveRedisSlow serves a request of modeRedis on the general decision:
// Redis is in back-off, or the client key is long.
func serveRedisSlow(p *Plugin, rw http.ResponseWriter, req *http.Request, layers []*layer, client string) {
	if ok, _ := decide(p, rw, req, layers, client, ""); ok {
		p.next.ServeHTTP(rw, req)
	}
}

// redisFailed decides in memory a request whose script call failed, as
// redisStore.take does.
func redisFailed(p *Plugin, rw http.ResponseWriter, req *http.Request, layers []*layer, client string, now int64, err error) {
	rs := p.fast.store

	// A closed pool is not Redis failing (redisStore.take).
	if !errors.Is(err, redisresp.ErrClosed) {
		rs.backend.failed(now, false, err)
	}

	var t tally

	rs.local.take(&t, now, layers, client, "", req, false)
	answer(p, rw, req, layers, &t, client, now)
}

// redisReply decides a request on a reply that redisPath did not accept: a
// refusal, or a malformed reply (then in memory).
func redisReply(p *Plugin, rw http.ResponseWriter, req *http.Request, layers []*layer, client string, now int64, ints []int64) {
	var t tally

	if err := p.fast.store.record(&t, ints, now, layers, client, "", req, false); err != nil {
		redisFailed(p, rw, req, layers, client, now, err)
		return
	}

	answer(p, rw, req, layers, &t, client, now)
}

// answer is decide after the charge, for a request of modeRedis.
func answer(p *Plugin, rw http.ResponseWriter, req *http.Request, layers []*layer, t *tally, client string, now int64) {
	if t.firsts != 0 {
		report(p, layers, t.firsts, client, "", req)
	}

	setHeaders(rw.Header(), layers[t.shown], t.left, t.reset, t.resetH, now)

	if t.refused {
		reject(p, rw, req, layers[t.shown], t.count, t.reset, now)
		return
	}

	p.next.ServeHTTP(rw, req)
}
