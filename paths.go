package tierlimit

import (
	"errors"
	"net/http"
	"strconv"

	"github.com/tierlimit/tierlimit/answer"
	"github.com/tierlimit/tierlimit/counter"
	"github.com/tierlimit/tierlimit/limit"
	"github.com/tierlimit/tierlimit/memstore"
	"github.com/tierlimit/tierlimit/redisresp"
	"github.com/tierlimit/tierlimit/redisstore"
	"github.com/tierlimit/tierlimit/request"
	"github.com/tierlimit/tierlimit/rule"
)

// The fast path serves modeAnonymous, modePrincipal(Plans) and modeClassify.
// chooseMode guarantees it: the memory store, headers on, no dry run, only
// fixed windows, each keyed by the client IP, the principal or a constant
// (never by a header), no credential cookie or query parameter, no
// connection cap, no exemptions; in modeAnonymous also plans that are never
// empty. So it charges p.memory directly, always sets headers, and needs no
// tally. Requests that a route matches are handed to serveGeneral
// (paths.tmpl, with general.go), which handles everything.
//
// The paths themselves are in paths_gen.go, generated from paths.tmpl; this
// file holds what they call on a refusal.

// The handlers of the fast modes: New returns one of them (Plugin.handler),
// so that a request starts on its mode's path without a dispatch frame
// (doc.go: frames). Each is the Plugin under another name, whose ServeHTTP is
// that mode's path; Plugin.ServeHTTP dispatches to the same methods.
type (
	anonymousPath      Plugin // modeAnonymous
	principalPath      Plugin // modePrincipal
	principalPlansPath Plugin // modePrincipalPlans
	classifyPath       Plugin // modeClassify
	generalPath        Plugin // modeGeneral
)

// ServeHTTP is modeGeneral's path: the status page, else serveGeneral,
// without the Plugin's ServeHTTP's dispatch in its frame (doc.go: frames).
func (g *generalPath) ServeHTTP(rw http.ResponseWriter, req *http.Request) {
	p := (*Plugin)(g)
	if p.status != nil && serveStatus(p, rw, req) {
		return
	}

	serveGeneral(p, rw, req, nil)
}

// refusalHeaders are the names of a layer's cached refusal's values
// (rule.CacheRefusal).
var refusalHeaders = rule.RefusalHeaders

// cacheWindowRefusal is rule.CacheRefusal for the window w of l; out of
// refuseFast, whose frame would hold its arguments (doc.go: frames).
func cacheWindowRefusal(l *rule.Layer, w *counter.Entry, secs int64) {
	rule.CacheRefusal(l, w.ResetH[0], w.Reset, secs)
}

// refuseOther is refuseFast for a configured body, a WebSocket upgrade, or
// the window's first refusal, which is reported.
func refuseOther(p *Plugin, rw http.ResponseWriter, req *http.Request, l *rule.Layer, w *counter.Entry, now int64) {
	reset, resetH := w.Reset, w.ResetH
	first := !w.Logged
	w.Logged = true

	p.memory.Mu.Unlock()

	// The event's keys are found again here, off the common refusal.
	if first {
		client := clientKey(p.ips, req)
		p.events.Refused(l.Name, rule.KeyFor(l, client, request.PrincipalOf(p.UserHeader, req), nil), client, l.DryRun)
	}

	setHeaders(rw.Header(), l, 0, reset, resetH, now)
	reject(p, rw, req, l, reset, now)
}

// The Redis fast path serves modeRedis. chooseMode guarantees it what
// modeAnonymous has (headers on, no dry run, fixed windows, no principal, no
// credential, no route, no connection cap, no exemption), with the Redis
// store instead of memory (on a Cluster, clusterPath, mixedPath and
// syncedPath: config.RedisFastEligible), and an ip layer keyed by the client
// on every plan (assets too, when asset prefixes apply): each plan charges
// global (when on) and one layer keyed by the client. So the script call of
// a plan is encoded once but for the client's key (redisPlan), and the
// common request, every layer allowed with Redis healthy and none of its
// keys blocked, is served here. Every other case takes the Redis store's
// own code (redisstore/store.go): a blocked key is refused by refuseBlocked,
// Redis in back-off decided by serveRedisSlow, a failed call by redisFailed,
// a refusal or a reply the fast path does not accept by redisReply.

// redisFast is what redisPath reads: the store and the plans' calls.
type redisFast struct {
	mixed  bool // some layer counts in memory: mixedPath
	pair   bool // a Cluster with global in Redis: clusterPath
	store  *redisstore.RedisStore
	ip     *redisPlan
	assets *redisPlan // nil without asset prefixes
}

// redisPlan is the script call of a plan (redisstore.FastCall: the command
// is heads[len(client)] + client + tail, sent to cluster, nil for one server
// or a Sentinel's primary) and its layers: shared those counted in Redis,
// which the call charges, memory those counted in memory (mixedPath), each
// one's place in the plan in sharedAt and memoryAt. On clusterPath the call
// is the client's layer's alone, and constCmd that of global, the plan's
// first layer, on the node of its slot, constSlot.
type redisPlan struct {
	call                   redisresp.Call
	heads                  []string
	tail                   string
	cluster                *redisresp.Cluster
	layers, shared, memory []*rule.Layer
	sharedAt, memoryAt     []int
	constCmd               string
	constSlot              int
}

// clusterPath is the Redis path of a modeRedis instance on a Cluster with
// global counted in Redis (redisFast.pair): global's key and the client's
// are in two slots, so each is charged by a call of its own on its slot's
// node, both sent before either reply is read (redisresp.PairInts), in one
// round trip of time. Its ServeHTTP is in paths.tmpl.
type clusterPath Plugin

// clusterOther is clusterPath for a request whose calls did not both allow
// it: a call without a reply (decided in memory, as the general path
// decides a failed call), or a refusal, a call that did not run or was not
// sent (a redirection, a missing script, the Cluster's map to read: the
// general path's call does it), which redisstore.SettlePair settles across
// the two slots (all or nothing) before the request is answered from the
// replies or decided anew.
func clusterOther(p *Plugin, rw http.ResponseWriter, req *http.Request, layers []*rule.Layer, client string, va int64, ia []int64, vb int64, ib []int64, err error) {
	if err != nil {
		redisFailed(p, rw, req, layers, client, err)
		return
	}

	c := chargeOf(layers, client, "", req, p.now().UnixNano(), false)
	if ints, again := redisstore.SettlePair(p.fast.store, c, va, ia, vb, ib); again {
		serveRedisSlow(p, rw, req, layers, client)
	} else {
		redisReply(p, rw, req, layers, client, ints)
	}
}

// mixedPath is the Redis path of an instance with layers counted in memory
// (modeRedis, redisFast.mixed). Its ServeHTTP and mixedShared are in
// paths.tmpl.
type mixedPath Plugin

// mixedOther is mixedPath for a request that Redis did not simply allow:
// the memory layers are given their point back, then a refusal by Redis
// (the reply ends in a count above its layer's points) is answered from the
// reply, and anything else is decided anew on the general path, after
// Redis's failure is recorded so that the general path does not wait for
// it again.
func mixedOther(p *Plugin, rw http.ResponseWriter, req *http.Request, rp *redisPlan, client string, ints []int64, err error) {
	now := p.now().UnixNano()
	s := p.memory
	s.Mu.Lock()
	unspendMemory(rp, len(rp.memory), client, now)
	s.Mu.Unlock()

	if n := len(ints) / 2; err == nil && n > 0 && n <= len(rp.shared) && limit.Over(ints[2*n-2], rp.shared[n-1].Capacity) {
		redisReply(p, rw, req, rp.shared, client, ints)
		return
	}

	// A Cluster's redirection (a server error) is the general path's to
	// follow: Redis did not fail.
	if err != nil && !errors.Is(err, redisresp.ErrClosed) && !errors.Is(err, redisresp.ErrPoolTimeout) && (rp.cluster == nil || !errors.Is(err, redisresp.ErrServer)) {
		p.fast.store.Backend.Failed(now, false, err)
	}

	serveRedisSlow(p, rw, req, rp.layers, client)
}

// maxFastClientKey bounds the client keys whose call head is encoded once:
// an IPv6 address with its prefix length takes at most 43 bytes. Longer
// keys are served by serveRedisSlow.
const maxFastClientKey = 64

// newRedisFast encodes the calls of the plans of a modeRedis instance.
func newRedisFast(rs *redisstore.RedisStore, ps plans) *redisFast {
	f := &redisFast{store: rs, ip: newRedisPlan(rs, ps.planIP, 1)}
	if ps.planAssets != nil {
		f.assets = newRedisPlan(rs, ps.planAssets, 1)
	}

	f.mixed = f.ip.memory != nil || f.assets != nil && f.assets.memory != nil
	if !f.mixed && f.ip.cluster != nil && ps.planIP[0].KeyKind == keyOfConst {
		f.pair = true
		f.ip = newClusterPair(rs, ps.planIP)
		if ps.planAssets != nil {
			f.assets = newClusterPair(rs, ps.planAssets)
		}
	}

	return f
}

// newClusterPair encodes clusterPath's two calls of a plan of global and
// one layer keyed by the client, each in its own slot on a Cluster: the
// client's layer's as newRedisPlan encodes a plan of it alone, and
// global's, whole.
func newClusterPair(rs *redisstore.RedisStore, layers []*rule.Layer) *redisPlan {
	rp := newRedisPlan(rs, layers[1:], 1)
	rp.layers = layers
	cmd, slot := redisstore.EncodeConst(rp.call, layers[0])
	rp.constCmd = cmd
	rp.constSlot = slot

	return rp
}

// newRedisPlan encodes the call of a plan with one layer keyed by the client
// (redisstore.EncodeFast); each request costs cost.
func newRedisPlan(rs *redisstore.RedisStore, layers []*rule.Layer, cost int64) *redisPlan {
	memory, shared, memoryAt, sharedAt := redisstore.SplitLayers(layers)
	f := redisstore.EncodeFast(rs, shared, cost, maxFastClientKey)

	return &redisPlan{
		call: f.Call, heads: f.Heads, tail: f.Tail, cluster: f.Cluster,
		layers: layers, shared: shared, memory: memory, sharedAt: sharedAt, memoryAt: memoryAt,
	}
}

// redisPath is the handler of modeRedis (see paths.go's handlers).
type redisPath Plugin

// refuseBlockedGeneral is refuseBlocked through the store's takeBlocked.
func refuseBlockedGeneral(p *Plugin, rw http.ResponseWriter, req *http.Request, layers []*rule.Layer, client string, now int64) bool {
	var t rule.Tally

	c := chargeOf(layers, client, "", req, now, false)
	if !p.fast.store.TakeBlocked(&t, c) {
		return false
	}

	answerRedis(p, rw, req, &t, c)

	return true
}

// serveRedisSlow serves a request of modeRedis on the general decision:
// Redis is in back-off, or the client key is long.
func serveRedisSlow(p *Plugin, rw http.ResponseWriter, req *http.Request, layers []*rule.Layer, client string) {
	if ok, _ := decide(p, rw, req, layers, client, "", requestCost); ok {
		p.next.ServeHTTP(rw, req)
	}
}

// redisFailed decides in memory a request whose script call failed, as
// redisstore.Take does.
func redisFailed(p *Plugin, rw http.ResponseWriter, req *http.Request, layers []*rule.Layer, client string, err error) {
	now := p.now().UnixNano()
	rs := p.fast.store

	// A closed pool is not Redis failing (redisstore.Take).
	if !errors.Is(err, redisresp.ErrClosed) && !errors.Is(err, redisresp.ErrPoolTimeout) {
		rs.Backend.Failed(now, false, err)
	}

	var t rule.Tally

	c := chargeOf(layers, client, "", req, now, false)
	rs.TakeLocal(&t, c)
	answerRedis(p, rw, req, &t, c)
}

// redisReply decides a request on a reply that redisPath did not accept: a
// refusal, or a malformed reply (then in memory).
func redisReply(p *Plugin, rw http.ResponseWriter, req *http.Request, layers []*rule.Layer, client string, ints []int64) {
	now := p.now().UnixNano()
	var t rule.Tally

	c := chargeOf(layers, client, "", req, now, false)
	if err := redisstore.Record(p.fast.store, &t, c, ints); err != nil {
		redisFailed(p, rw, req, layers, client, err)
		return
	}

	answerRedis(p, rw, req, &t, c)
}

// answerRedis is decide after the charge c, for a request of modeRedis.
func answerRedis(p *Plugin, rw http.ResponseWriter, req *http.Request, t *rule.Tally, c *rule.Charge) {
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

// syncedPath is the handler of a modeRedis instance with redis.syncInterval
// (redisstore/syncstore.go): the anonymous path, spending the synced
// counters' leases under their lock, as anonymousPath charges the memory
// store's windows. A plan here is global and at most one more layer
// (TestFastPlansHoldTwoLayers), so a refusal gives back at most the one
// charge before it. A counter without a lease, a window's first refusal, a
// configured body and a WebSocket upgrade take SyncTake and answer, which
// ask Redis for a lease, report and build the refusal; later refusals of a
// key Redis has no room for reuse the layer's refusal cache (under the
// synced counters' lock: this instance charges no memory window and keeps
// no block list).
type syncedPath Plugin

// Its ServeHTTP and refuseSynced are in paths.tmpl.

// serveOnCounters decides a request of syncedPath on its synced counters (SyncTake), and answers
// it: a counter without a lease, a window's first refusal, a configured
// body, a WebSocket upgrade (refuseSynced).
func serveOnCounters(p *Plugin, rw http.ResponseWriter, req *http.Request, layers []*rule.Layer, client string, now int64) {
	var t rule.Tally

	c := chargeOf(layers, client, "", req, now, false)
	redisstore.SyncTake(p.fast.store.Synced, &t, c)
	answerRedis(p, rw, req, &t, c)
}

// The header arithmetic of the generated paths (paths.tmpl); the answer
// itself (headers beyond the tables, Retry-After, the refusal, the
// WebSocket close) is package answer.

// Constants of the header arithmetic: typed expressions such as
// int64(time.Second) or int64(len(smallInts)) are evaluated per request under
// Yaegi (doc.go: frames).
const (
	nsPerSecond = 1000000000
	maxSmallInt = answer.MaxSmallInt
)

// smallInts are the decimal forms of 0 to maxSmallInt, for header values
// (answer.SmallInts, the same slice).
var smallInts = answer.SmallInts

func formatInt(n int64) string {
	return strconv.FormatInt(n, 10)
}

// unspendMemory is memstore.UnspendFast for the first n memory layers of plan rp,
// which mixedPath charges a point each: a call of chargeMemory's own shape,
// whose frame holds no more for it (doc.go: frames).
func unspendMemory(rp *redisPlan, n int, client string, now int64) {
	memstore.UnspendFast(rp.memory, n, client, 1, now)
}

// unseen is the window serveCountedFast's check reads for a key without a
// live one: a count of 0, never charged nor shown.
var unseen = &counter.Entry{}

// routedAnew is serveRoutedFast's and serveCountedFast's refusal, called
// with the memory store locked: the first n layers are given back what they
// took (memstore.UnspendFast), and serveGeneral decides the request anew, with its
// events and headers. A function of its own: the requests it allowed do not
// pay for its frame (doc.go: frames).
func routedAnew(p *Plugin, rw http.ResponseWriter, req *http.Request, matched []*route, layers []*rule.Layer, n int, client string, cost, now int64) {
	memstore.UnspendFast(layers, n, client, cost, now)
	p.memory.Mu.Unlock()
	serveGeneral(p, rw, req, matched)
}
