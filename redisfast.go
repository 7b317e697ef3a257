package tierlimit

import (
	"errors"
	"net/http"
	"strconv"

	"github.com/tierlimit/tierlimit/redisstore"

	"github.com/tierlimit/tierlimit/config"
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
	rp := &redisPlan{call: rs.CallFor(len(layers))}
	front, key, tail, args := rp.call.Head(), "", "", redisstore.ArgOneInteger+redisstore.CostArg(cost)
	seen := false

	for _, l := range layers {
		args += l.RedisArgs

		switch {
		case l.KeyKind != keyOfConst:
			key = l.RedisKey
			tail = "\r\n"
			seen = true
		case seen:
			tail += l.RedisConstKey
		default:
			front += l.RedisConstKey
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
func redisFastEligible(s *config.Settings, fixed, routes bool) bool {
	return s.Store == config.StoreRedis && s.Redis.Cluster == nil && !anyMemoryLayer(s) &&
		s.Headers && !s.DryRun && fixed && !routes && s.WSMaxPerIP == 0 &&
		s.UserHeader == "" && len(s.CredHeaders)+len(s.CredCookies)+len(s.CredQuery) == 0 &&
		len(s.ExemptIPs)+len(s.ExemptIDs) == 0 &&
		s.Spec(layerIP).On() && (s.Spec(layerAssets).On() || len(s.AssetPaths) == 0)
}

// redisPath is the handler of modeRedis (see fast.go's handlers).
type redisPath Plugin

// refuseBlockedGeneral is refuseBlocked through the store's takeBlocked.
func refuseBlockedGeneral(p *Plugin, rw http.ResponseWriter, req *http.Request, layers []*layer, client string, now int64) bool {
	var t tally

	c := chargeOf(layers, client, "", req, now, false)
	if !p.fast.store.TakeBlocked(&t, c) {
		return false
	}

	answerRedis(p, rw, req, &t, c)

	return true
}

// serveRedisSlow serves a request of modeRedis on the general decision:
// Redis is in back-off, or the client key is long.
func serveRedisSlow(p *Plugin, rw http.ResponseWriter, req *http.Request, layers []*layer, client string) {
	if ok, _ := decide(p, rw, req, layers, client, "", requestCost); ok {
		p.next.ServeHTTP(rw, req)
	}
}

// redisFailed decides in memory a request whose script call failed, as
// redisStore.take does.
func redisFailed(p *Plugin, rw http.ResponseWriter, req *http.Request, layers []*layer, client string, now int64, err error) {
	rs := p.fast.store

	// A closed pool is not Redis failing (redisStore.take).
	if !errors.Is(err, redisresp.ErrClosed) && !errors.Is(err, redisresp.ErrPoolTimeout) {
		rs.Backend.Failed(now, false, err)
	}

	var t tally

	c := chargeOf(layers, client, "", req, now, false)
	rs.TakeLocal(&t, c)
	answerRedis(p, rw, req, &t, c)
}

// redisReply decides a request on a reply that redisPath did not accept: a
// refusal, or a malformed reply (then in memory).
func redisReply(p *Plugin, rw http.ResponseWriter, req *http.Request, layers []*layer, client string, now int64, ints []int64) {
	var t tally

	c := chargeOf(layers, client, "", req, now, false)
	if err := p.fast.store.Record(&t, c, ints); err != nil {
		redisFailed(p, rw, req, layers, client, now, err)
		return
	}

	answerRedis(p, rw, req, &t, c)
}

// answerRedis is decide after the charge c, for a request of modeRedis.
func answerRedis(p *Plugin, rw http.ResponseWriter, req *http.Request, t *tally, c *charge) {
	if t.Firsts != 0 {
		report(p, c, t.Firsts)
	}

	setHeaders(rw.Header(), c.Layers[t.Shown], t.Left, t.Reset, t.ResetH, c.Now)

	if t.Refused {
		reject(p, rw, req, c.Layers[t.Shown], t.Reset, c.Now)
		return
	}

	p.next.ServeHTTP(rw, req)
}
