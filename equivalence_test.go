package tierlimit

import (
	"io"
	"math/rand"
	"net/http"
	"net/http/httptest"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/config"
	"github.com/tierlimit/tierlimit/limit"
	"github.com/tierlimit/tierlimit/redisresp"
	"github.com/tierlimit/tierlimit/redisstore"
)

// TestPathsAgree runs one seeded script of requests through every
// configuration shape twice: on the path chooseMode picks and on the general
// path (for the Redis shape, whose Redis is down: on its memory twin's fast
// path, since the fallback must decide as memory does). Status, body, every
// rate-limit header, the backend calls and the events must agree.
func TestPathsAgree(t *testing.T) {
	for i, sh := range shapes {
		if sh.mode == modeOff {
			continue
		}

		a, b := newHarness(t, sh.cfg), newHarness(t, sh.cfg)

		if sh.name == "redis" {
			cfg := CreateConfig()
			sh.cfg(cfg)
			cfg.Redis.Address = closedPort(t)

			s, err := parse(cfg)
			if err != nil {
				t.Fatal(err)
			}

			pool := redisresp.NewPool(s.Redis)
			redisStoreOf(a.p).Backend = &redisstore.RedisBackend{Pool: pool, Single: pool, Address: cfg.Redis.Address, Log: io.Discard}
			b = newHarness(t, with(sh.cfg, func(c *Config) { c.Store = "memory" }))
		} else {
			b.p.mode = modeGeneral
			b.h = b.p
		}

		if sh.mode != modeGeneral && a.p.mode != sh.mode {
			t.Fatalf("%s: mode %d", sh.name, a.p.mode)
		}

		runScript(t, sh.name, int64(i+1), a, b)
	}
}

var (
	scriptMethods = []string{http.MethodGet, http.MethodGet, http.MethodPost, http.MethodPut, http.MethodHead}
	scriptPaths   = []string{
		"/api", "/api", "/assets/a.js", "/auth/login", "/users/7", "/export", "/missing/x", "/_tierlimit",
		"/Auth/Login;x=1/", "/USERS//7", "/assets/../auth/login", "/ASSETS/a.js", "/assets//b.css", "/assetsx",
	}
	scriptClients = []struct{ remote, forwarded string }{
		{"203.0.113.1:1", ""},
		{"203.0.113.7:2", ""},
		{"[2001:db8::1]:1", ""},
		{"[2001:db8::2]:3", ""}, // the same /64 as the one above
		{"10.0.0.1:5", "198.51.100.4"},
		{"10.0.0.1:5", "198.51.100.9, 10.0.0.2"},
		{"127.0.0.1:9", ""}, // allowed to see the status endpoint
	}
	scriptCredentials = []func(req *http.Request){
		nil, nil,
		func(req *http.Request) { req.Header.Set("Authorization", "Bearer good") },
		func(req *http.Request) { req.Header.Set("Authorization", " ") },
		func(req *http.Request) { req.AddCookie(&http.Cookie{Name: "session", Value: "s1"}) },
		func(req *http.Request) { req.URL.RawQuery = "token=t1" },
		func(req *http.Request) { req.Header.Set("X-Api-Key", "k1") },
	}
	scriptPrincipals = []map[string]string{
		nil, nil,
		{"X-Auth-User": "alice"},
		{"X-Auth-User": "bob"},
		{"X-Auth-User": "batch", "X-Auth-Service-Account": "true"},
		{"X-Auth-User": "carol", "X-Auth-Plan": "pro"},
		{"X-Auth-User": "dave", "X-Auth-Plan": "free"},
		{"X-Auth-User": "erin", "X-Auth-Plan": "gold"}, // no such plan: user
		{"X-Auth-User": "frank", "X-Auth-Plan": "open"},
		{"X-Auth-User": "batch", "X-Auth-Service-Account": "true", "X-Auth-Plan": "pro"},
		{"X-Auth-Plan": "pro"}, // no principal: ip
	}
	rateLimitHeaders = []string{"X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset", "RateLimit-Policy", "RateLimit", "Retry-After", "Content-Type"}
)

func runScript(t *testing.T, name string, seed int64, a, b *harness) {
	t.Helper()

	rng := rand.New(rand.NewSource(seed))
	refusals := 0

	for i := 0; i < 500; i++ {
		method := scriptMethods[rng.Intn(len(scriptMethods))]
		path := scriptPaths[rng.Intn(len(scriptPaths))]
		client := scriptClients[rng.Intn(len(scriptClients))]
		cred := scriptCredentials[rng.Intn(len(scriptCredentials))]
		principal := scriptPrincipals[rng.Intn(len(scriptPrincipals))]

		send := func(h *harness) *httptest.ResponseRecorder {
			req := httptest.NewRequest(method, path, nil)
			req.RemoteAddr = client.remote

			if client.forwarded != "" {
				req.Header.Set("X-Forwarded-For", client.forwarded)
			}

			if cred != nil {
				cred(req)
			}

			for k, v := range principal {
				req.Header.Set(k, v)
			}

			rec := httptest.NewRecorder()
			h.h.ServeHTTP(rec, req)

			return rec
		}

		ra, rb := send(a), send(b)
		what := name + ": request " + strconv.Itoa(i) + " (" + method + " " + path + " from " + client.remote + ")"

		bodyA := strings.ReplaceAll(ra.Body.String(), a.p.name, "")
		bodyB := strings.ReplaceAll(rb.Body.String(), b.p.name, "")

		if ra.Code != rb.Code || bodyA != bodyB {
			t.Fatalf("%s: %d %q vs %d %q", what, ra.Code, bodyA, rb.Code, bodyB)
		}

		for _, k := range rateLimitHeaders {
			if ra.Header().Get(k) != rb.Header().Get(k) {
				t.Fatalf("%s: %s %q vs %q", what, k, ra.Header().Get(k), rb.Header().Get(k))
			}
		}

		if ra.Code == http.StatusTooManyRequests {
			refusals++
		}

		if rng.Intn(6) == 0 {
			step := time.Duration(rng.Intn(700)) * time.Millisecond
			a.clock.Add(step)
			b.clock.Add(step)
		}
	}

	if a.calls.Load() != b.calls.Load() {
		t.Fatalf("%s: backend called %d vs %d times", name, a.calls.Load(), b.calls.Load())
	}

	evA := strings.ReplaceAll(a.events.String(), a.p.name, "")
	evB := strings.ReplaceAll(b.events.String(), b.p.name, "")

	if evA != evB {
		t.Fatalf("%s: events differ:\n%s\nvs\n%s", name, evA, evB)
	}

	if len(a.p.layers) > 0 && (evA == "" || refusals == 0 && !a.p.dryRun) {
		t.Fatalf("%s: %d refusals, events %q: the script does not reach a refusal", name, refusals, evA)
	}
}

// The equivalence of the stores: memory, exact Redis (one script call per
// request) and synced Redis (redis.syncInterval, one replica) give the same
// answer to every request of a seeded script, with routes that cost more
// than one point, and hold the same counts at its end.
// TestMemoryAndRedisAgreeOnRedisServer (redisserver_test.go) does the same
// for memory and exact Redis over every configuration shape.

// costedShape draws a configuration from seed: the edge layers and four
// routes the script's paths reach, each with a cost from 1 to 5 and points
// at least that cost, one of them on a calendar day, the others of
// algorithm ("fixed", "sliding" or "tokenbucket"; the ip layer too).
func costedShape(seed int64, algorithm string) func(c *Config) {
	return func(c *Config) {
		rng := rand.New(rand.NewSource(seed))
		costed := func(name, key string, methods, paths []string) config.RouteConfig {
			cost := 1 + rng.Intn(5)
			rc := config.RouteConfig{Name: name, Key: key, Methods: methods, Paths: paths, Cost: cost, Points: unfitPoints(cost, rng), Duration: "1h"}

			if algorithm != "fixed" {
				rc.Algorithm = algorithm
			}

			if algorithm == "tokenbucket" {
				rc.Burst, rc.Points = rc.Points, 1
			}

			return rc
		}

		c.Global = config.LayerConfig{Points: 60 + rng.Intn(40), Duration: "1h"}
		c.IP = config.LayerConfig{Points: 12 + rng.Intn(12), Duration: "1h"}
		c.Assets = config.AssetsConfig{Points: 8, Duration: "1h", PathPrefixes: []string{"/assets/"}}
		c.User = config.LayerConfig{Points: 6, Duration: "1h"}
		c.Principal.UserHeader = "X-Auth-User"
		c.Principal.CredentialHeaders = []string{"Authorization"}

		if algorithm != "fixed" {
			c.IP.Algorithm = algorithm
		}

		if algorithm == "tokenbucket" {
			c.IP.Burst, c.IP.Points = c.IP.Points, 1
		}

		login := costed("auth_login", "", []string{"POST"}, []string{"/auth/login"})
		login.Algorithm, login.Burst, login.Duration, login.Calendar = "", 0, "", "day"
		login.Points = unfitPoints(login.Cost, rng)

		c.Routes = []config.RouteConfig{
			login,
			costed("export", "", nil, []string{"/export"}),
			costed("api_write", "principal", []string{"POST", "PUT"}, []string{"/api", "/users/"}),
			costed("users", "", nil, []string{"/users/"}),
		}
	}
}

// unfitPoints is a route's points for cost: at least cost, and not a
// multiple of it when it is above 1, so that the route's last request does
// not fit while points are left.
func unfitPoints(cost int, rng *rand.Rand) int {
	points := cost + 1 + rng.Intn(6)
	if cost > 1 && points%cost == 0 {
		points++
	}

	return points
}

// synced is a Redis instance's configuration with redis.syncInterval.
func synced(c *Config) {
	c.Redis.SyncInterval = "1h"
}

// syncable reports whether conf may be synced: fixed and calendar windows
// only, no block (config/sync.go).
func syncable(conf func(c *Config)) bool {
	cfg := CreateConfig()
	conf(cfg)
	cfg.Store = "redis"
	synced(cfg)

	_, err := parse(cfg)

	return err == nil
}

// TestStoresAgreeWithCostsOnRedisServer: seeded configurations with costed
// routes (fixed and calendar windows; sliding windows and token buckets,
// which synced counting does not support, on memory and exact Redis only)
// answer every request of a seeded script alike on memory, exact Redis and
// synced Redis synced every k requests, and end with the same counts.
func TestStoresAgreeWithCostsOnRedisServer(t *testing.T) {
	addr, admin := redisServer(t)
	start := time.Now()
	unfit := map[string]int{}

	for seed := int64(1); seed <= 6; seed++ {
		for _, algorithm := range []string{"fixed", "sliding", "tokenbucket"} {
			name := algorithm + " seed " + strconv.FormatInt(seed, 10)
			conf := costedShape(seed, algorithm)

			a := newHarness(t, conf)
			b, _ := redisHarness(t, addr, with(conf, asACLUser))
			agreeOnRedis(t, name+", exact", seed, a, b, admin, start)
			agreeCounts(t, name+", exact", a, b, admin, nil)
			unfit[algorithm] += refusedUnfit(a)

			if algorithm != "fixed" {
				continue
			}

			plan := syncPlan{every: 1 + int(seed*7)%11, straddle: seed%2 == 0}
			agreeSynced(t, name+", "+plan.String(), seed, plan, conf, addr, admin)
		}
	}

	for _, algorithm := range []string{"fixed", "sliding", "tokenbucket"} {
		if unfit[algorithm] == 0 {
			t.Errorf("%s: no window refused a request that did not fit while it had points left: the scripts do not reach that case", algorithm)
		}
	}
}

// refusedUnfit is the number of windows of the memory instance h (fixed,
// calendar and sliding) that refused a request while they held less than
// their points: requests of a cost above 1 that did not fit, refused whole.
func refusedUnfit(h *harness) int {
	h.p.memory.Mu.Lock()
	defer h.p.memory.Mu.Unlock()

	n := 0

	for _, l := range h.p.layers {
		for _, w := range h.p.memory.Maps[l.Name] {
			if l.Algorithm != limit.TokenBucket && w.Refused > 0 && w.Count < l.Capacity {
				n++
			}
		}
	}

	return n
}

// TestMemoryAndSyncedRedisAgreeOnRedisServer: every configuration shape
// that synced counting supports (fixed and calendar windows, no block)
// answers runScript's requests on a synced Redis instance, the one replica,
// as on memory, whether it syncs after every request (each sync still in
// flight while the next request is decided), every few, or only at the
// end: a single replica's answers do not depend on when it syncs.
func TestMemoryAndSyncedRedisAgreeOnRedisServer(t *testing.T) {
	addr, admin := redisServer(t)
	ran := 0

	for i, sh := range shapes {
		if sh.mode == modeOff || sh.name == "redis" || sh.name == "status" {
			continue
		}

		conf := with(sh.cfg, longWindows)
		if !syncable(conf) {
			continue
		}

		ran++

		for _, plan := range []syncPlan{{every: 1, straddle: true}, {every: 5}, {every: 1000}} {
			agreeSynced(t, sh.name+", "+plan.String(), int64(i+1), plan, conf, addr, admin)
		}
	}

	if ran < 20 {
		t.Fatalf("%d shapes synced: the filter leaves out too many", ran)
	}
}

// syncPlan is when a synced instance syncs: after every so many requests,
// and with straddle, each sync collects its points then and gets Redis's
// totals only after the next request was decided (a sync in flight, as
// the goroutine's may be).
type syncPlan struct {
	every    int
	straddle bool
}

func (p syncPlan) String() string {
	s := "synced every " + strconv.Itoa(p.every)
	if p.straddle {
		s += ", in flight over the next request"
	}

	return s
}

// agreeSynced runs one seeded script through a memory instance and a synced
// Redis one, which syncs as plan says and at the end: every answer and the
// events must agree, and then every count (agreeCounts). The synced windows
// are aligned to the epoch, the memory ones start at the first request:
// their resets may differ by the part of a second the clock is past the
// window's start.
func agreeSynced(t *testing.T, name string, seed int64, plan syncPlan, conf func(c *Config), addr string, admin *redisresp.Pool) {
	t.Helper()

	a := newHarness(t, conf)
	b, _ := redisHarness(t, addr, with(with(conf, asACLUser), synced))
	st := syncedOf(t, b)
	now := b.clock.Now().UnixNano()

	rng := rand.New(rand.NewSource(seed))
	refusals, pending := 0, map[string]int{}
	var batch []redisstore.LeaseAsk

	for i := 0; i < 300; i++ {
		send, desc := scriptRequest(rng)
		evA, evB := a.events.Len(), b.events.Len()
		ra := send(a)
		rb := sendDuringSync(t, st, batch, now, func() *httptest.ResponseRecorder { return send(b) })
		batch = nil
		what := name + ": request " + strconv.Itoa(i) + " (" + desc + ")"

		if msg := differ(ra, rb, a.p.name, b.p.name, 1); msg != "" {
			t.Errorf("%s: %s", what, msg)
			return
		}

		if msg := matchEvents(eventLines(a.events.String()[evA:], a.p.name), eventLines(b.events.String()[evB:], b.p.name), pending, false); msg != "" {
			t.Errorf("%s: %s", what, msg)
			return
		}

		if ra.Code == http.StatusTooManyRequests {
			refusals++
		}

		switch {
		case (i+1)%plan.every != 0:
		case plan.straddle:
			batch, _ = redisstore.CollectSync(st, now, false)
		default:
			mustSync(t, st, now)
		}
	}

	finishSync(t, st, batch, now)
	// Every lease back: Redis then counts what was admitted, as memory does.
	if err := redisstore.SyncNow(st, now, true); err != nil {
		t.Fatalf("%s: the last sync: %v", name, err)
	}

	if a.calls.Load() != b.calls.Load() {
		t.Errorf("%s: backend called %d vs %d times", name, a.calls.Load(), b.calls.Load())
	}

	if len(a.p.layers) > 0 && (a.events.Len() == 0 || refusals == 0 && !a.p.dryRun) {
		t.Errorf("%s: %d refusals, events %q: the script does not reach a refusal", name, refusals, a.events.String())
	}

	agreeCounts(t, name, a, b, admin, st)
}

// syncedOf is b's synced counters, on b's backend and clock (syncHarness's
// set-up, for a store a month policy may wrap).
func syncedOf(t *testing.T, b *harness) *redisstore.SyncState {
	t.Helper()

	rs := b.p.stores.redis
	if rs == nil || rs.Synced == nil {
		t.Fatalf("redis.syncInterval made no synced store: %T", b.p.stores)
	}

	st := rs.Synced
	st.Mu.Lock()
	st.Backend, st.Now = rs.Backend, b.clock.Now
	st.Mu.Unlock()

	return st
}

// sendDuringSync serves a request while the sync of batch, collected
// earlier (CollectSync), is in flight: the sync ends when the request is
// served, or, for a request that waits for it (its lease going back),
// a moment after it started.
func sendDuringSync(t *testing.T, st *redisstore.SyncState, batch []redisstore.LeaseAsk, now int64, send func() *httptest.ResponseRecorder) *httptest.ResponseRecorder {
	t.Helper()

	if batch == nil {
		return send()
	}

	served, synced := make(chan struct{}), make(chan error, 1)

	go func() {
		select {
		case <-served:
		case <-time.After(20 * time.Millisecond):
		}

		replies, err := redisstore.SendLeases(st.Backend, batch, now)
		if err != nil {
			replies = nil
		}

		redisstore.EndSync(st, batch, replies)
		synced <- err
	}()

	r := send()
	close(served)

	if err := <-synced; err != nil {
		t.Fatalf("sync: %v", err)
	}

	return r
}

// finishSync sends a sync's batch collected earlier (CollectSync) and
// applies Redis's answers, as SyncNow does after collecting.
func finishSync(t *testing.T, st *redisstore.SyncState, batch []redisstore.LeaseAsk, now int64) {
	t.Helper()

	if batch == nil {
		return
	}

	replies, err := redisstore.SendLeases(st.Backend, batch, now)
	if err != nil {
		t.Fatalf("sync: %v", err)
	}

	redisstore.EndSync(st, batch, replies)
}

// agreeCounts compares what the memory instance a counts in each window
// with the Redis keys of b: a fixed or calendar window's counter, a sliding
// window's current count; with st (synced), also each synced counter's
// total from its last sync. A token bucket's state is the time its tokens
// come back, which runs on Redis's clock there: its answers are compared,
// not its key. Keys of another instance on the server are told apart by
// b's prefix.
func agreeCounts(t *testing.T, name string, a, b *harness, admin *redisresp.Pool, st *redisstore.SyncState) {
	t.Helper()

	prefix := b.p.stores.redis.Prefix
	want := map[string]int64{} // the key's base: its prefix, layer and bucket
	bucketLayers := map[string]bool{}

	for _, l := range b.p.layers {
		if l.Algorithm == limit.TokenBucket {
			bucketLayers[prefix+l.Name+":"] = true
		}
	}

	a.p.memory.Mu.Lock()
	for layer, m := range a.p.memory.Maps {
		for bucket, w := range m {
			if w.Count != 0 && !bucketLayers[prefix+layer+":"] {
				want[prefix+layer+":"+bucket] += w.Count
			}
		}
	}
	a.p.memory.Mu.Unlock()

	got := map[string]int64{}

	for _, v := range redisDo(t, admin, "KEYS", prefix+"*").Array {
		key := v.Str
		if strings.HasSuffix(key, ":block") || bucketLayers[layerPrefix(key, prefix)] {
			continue
		}

		var n int64
		if redisDo(t, admin, "TYPE", key).Str == "hash" {
			n, _ = strconv.ParseInt(redisDo(t, admin, "HGET", key, "c").Str, 10, 64)
		} else {
			n, _ = strconv.ParseInt(redisDo(t, admin, "GET", key).Str, 10, 64)
		}

		if n != 0 {
			got[windowBase(key, want)] += n
		}
	}

	if st != nil {
		st.Mu.Lock()
		for _, m := range st.ByLayer {
			for _, c := range m {
				if c.Pending != 0 || c.Inflight != 0 || c.Lease != 0 || c.Remote != got[windowBase(c.Key, want)] {
					t.Errorf("%s: synced counter %s: remote %d, pending %d, in flight %d, lease %d after the last sync; Redis %d", name, c.Key, c.Remote, c.Pending, c.Inflight, c.Lease, got[windowBase(c.Key, want)])
				}
			}
		}
		st.Mu.Unlock()
	}

	if len(want) == 0 && len(a.p.layers) > 0 {
		t.Errorf("%s: memory counted nothing", name)
	}

	if msg := sameCounts(want, got); msg != "" {
		t.Errorf("%s: counts differ (memory, then Redis):\n%s", name, msg)
	}
}

// layerPrefix is the part of key up to its layer's name and colon.
func layerPrefix(key, prefix string) string {
	rest := strings.TrimPrefix(key, prefix)
	if i := strings.IndexByte(rest, ':'); i >= 0 {
		return prefix + rest[:i+1]
	}

	return key
}

// windowBase is key without the window's start a calendar or synced key
// ends with (":" and digits), when that names a counter of want.
func windowBase(key string, want map[string]int64) string {
	if _, ok := want[key]; ok {
		return key
	}

	i := strings.LastIndexByte(key, ':')
	if i < 0 {
		return key
	}

	if _, err := strconv.ParseInt(key[i+1:], 10, 64); err != nil {
		return key
	}

	return key[:i]
}

// sameCounts lists the keys whose counts differ, or is "".
func sameCounts(want, got map[string]int64) string {
	var diffs []string

	for k, n := range want {
		if got[k] != n {
			diffs = append(diffs, k+": "+strconv.FormatInt(n, 10)+" vs "+strconv.FormatInt(got[k], 10))
		}
	}

	for k, n := range got {
		if _, ok := want[k]; !ok {
			diffs = append(diffs, k+": none vs "+strconv.FormatInt(n, 10))
		}
	}

	sort.Strings(diffs)

	return strings.Join(diffs, "\n")
}
