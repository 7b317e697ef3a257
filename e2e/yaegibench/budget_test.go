package yaegibench

import (
	"bytes"
	"compress/gzip"
	"io"
	"net/http"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"

	"github.com/tierlimit/tierlimit/e2e/harness"
	"github.com/tierlimit/tierlimit/redisresp"
)

// Allocation budgets: allocations per request of each instance shape, loaded
// with Traefik's Yaegi loader. Unlike timings they are deterministic, so a
// change that makes the request path costlier fails here on any machine.
// Lower a budget when a change wins; raise one only with the reason in the
// commit. Windows last an hour and every key is warmed first, so the
// measured requests start no window.
var budgets = map[string]float64{
	"edge allowed":                214,
	"edge with a status page":     230,
	"edge forwarded":              251,
	"edge forwarded refused":      275,
	"edge refused":                238,
	"edge busy peers":             214,
	"edge busy peers refused":     238,
	"principal":                   246,
	"principal with plans":        259,
	"chain edge anonymous":        281,
	"chain edge credentialed":     278,
	"costed route":                345,
	"countStatus route":           410,
	"costFrom header route":       1167, // one RateLimit item: several only beside a concurrency layer (items.go)
	"costFrom json route":         1579,
	"costFrom gzip json route":    1982, // the body decoded by a goroutine of its own (usage/inflate.go)
	"costFrom llm sum route":      2009, // each level of the usage decoded into its raw members (usage/llm.go)
	"costFrom route beside slots": 1497, // an LLM gateway's: ip a concurrency layer, three RateLimit items (items.go: about 200 of these allocations)
	"json-keyed route":            973,  // the body read and decoded into its raw members (request/body.go), the API key hashed
	"redis, global in memory":     540,
	"redis allowed":               454,
	"redis refused":               240,
	"redis synced allowed":        214,
	"redis synced refused":        250,
	"concurrency allowed":         612,  // the general path, a slot taken and given back (memstore/concurrency.go)
	"concurrency on redis":        2182, // the script call and the release, a second call
	"concurrency on synced redis": 2836, // global from its lease, the slot in Redis and its release (redisstore/slots.go)
	"cluster allowed":             981,  // global's call and the client's, on their nodes, sent together; global's reply an array (a billion points an hour do not fit the one integer)
	"cluster refused":             272,
	"cluster synced allowed":      214,
	"maxDelay allowed":            565,  // the general path, ip with a maxDelay (memstore's apart), each request fitting at once
	"maxDelay delayed":            1040, // each request waits for its place: a timer and the context watched, then its headers written again as of its place (general.go: waitForPlace, about 60) (983-1008 measured, 933-937 before that: timers are not counted alike each pass)
}

// gzipUsage is the JSON body of the costFrom json route, gzip-compressed.
var gzipUsage = func() []byte {
	var b bytes.Buffer
	z := gzip.NewWriter(&b)
	_, _ = z.Write([]byte(`{"id":"x","usage":{"prompt_tokens":4,"total_tokens":10}}`))
	_ = z.Close()

	return b.Bytes()
}()

// longEdge is the edge of edgeConfig with hour-long windows.
func longEdge() map[string]any {
	return map[string]any{
		"global": map[string]any{"points": "1000000000", "duration": "1h"},
		"ip":     map[string]any{"points": "1000000", "duration": "1h"},
	}
}

func TestAllocationBudgets(t *testing.T) {
	refused := longEdge()
	refused["ip"] = map[string]any{"points": "1", "duration": "1h"}

	withStatus := longEdge()
	withStatus["status"] = map[string]any{"path": "/_tierlimit"}

	chain := longEdge()
	chain["routes"] = []any{
		map[string]any{"name": "auth_login", "methods": []any{"POST"}, "paths": []any{"/auth/login"}, "key": "ip", "points": "10", "duration": "60s"},
		map[string]any{"name": "email", "methods": []any{"POST"}, "paths": []any{"/auth/password/request", "/users/invite"}, "key": "ip", "points": "5", "duration": "60s"},
	}
	chain["principal"] = map[string]any{"credentialHeaders": []any{"Authorization"}}

	principal := map[string]any{
		"global":    map[string]any{"points": "0"},
		"ip":        map[string]any{"points": "0"},
		"assets":    map[string]any{"points": "0"},
		"user":      map[string]any{"points": "1000000", "duration": "1h"},
		"principal": map[string]any{"userHeader": "X-Auth-User"},
	}

	withPlans := map[string]any{}
	for k, v := range principal {
		withPlans[k] = v
	}
	withPlans["principal"] = map[string]any{"userHeader": "X-Auth-User", "planHeader": "X-Auth-Plan"}
	withPlans["plans"] = map[string]any{
		"free": map[string]any{"points": "1000000", "duration": "1h"},
		"pro":  map[string]any{"points": "1000000", "duration": "1h"},
	}

	users := func(i int, req *http.Request) { req.Header.Set("X-Auth-User", "user-"+strconv.Itoa(i)) }
	// Every other user on pro: the plan's bucket instead of user's.
	planUsers := func(i int, req *http.Request) {
		users(i, req)
		if i%2 == 0 {
			req.Header.Set("X-Auth-Plan", "pro")
		}
	}
	token := func(_ int, req *http.Request) { req.Header.Set("Authorization", "Bearer token") }
	// Behind a proxy on loopback, as the load benchmark sends requests.
	forwarded := func(_ int, req *http.Request) {
		req.Header.Set("X-Forwarded-For", req.RemoteAddr[:strings.LastIndexByte(req.RemoteAddr, ':')])
		req.RemoteAddr = "127.0.0.1:5555"
	}

	// A route match takes the general path (classifyPath hands it over):
	// an export of cost 10, and a login that a countStatus route checks
	// and, answered 200, does not charge.
	costed := longEdge()
	costed["routes"] = []any{
		map[string]any{"name": "export", "paths": []any{"/export"}, "key": "ip", "points": "1000000000", "duration": "1h", "cost": "10"},
	}
	plainRoute := longEdge()
	plainRoute["routes"] = []any{
		map[string]any{"name": "export", "paths": []any{"/export"}, "key": "ip", "points": "1000000000", "duration": "1h"},
	}
	counted := longEdge()
	counted["routes"] = []any{
		map[string]any{"name": "auth_login", "methods": []any{"POST"}, "paths": []any{"/auth/login"}, "key": "ip", "points": "1000000", "duration": "1h", "countStatus": []any{"401"}},
	}
	// ip as a concurrency layer: each request takes a slot and gives it
	// back once served, on the general path.
	concurrent := longEdge()
	concurrent["ip"] = map[string]any{"points": "1000", "duration": "1h", "algorithm": "concurrency"}
	// maxDelay: ip may delay, and never needs to; then a global token
	// bucket of one token a millisecond, which each request waits for.
	delayAllowed := longEdge()
	delayAllowed["ip"] = map[string]any{"points": "1000000", "duration": "1h", "maxDelay": "1s"}
	delayed := longEdge()
	delayed["global"] = map[string]any{"points": "1", "duration": "1ms", "algorithm": "tokenbucket", "burst": "1", "maxDelay": "1s"}
	export := func(_ int, req *http.Request) { req.URL.Path = "/export" }
	login := func(_ int, req *http.Request) { req.Method = http.MethodPost; req.URL.Path = "/auth/login" }

	shapes := []struct {
		name   string
		config map[string]any
		set    func(i int, req *http.Request)
	}{
		{"edge allowed", longEdge(), nil},
		{"edge with a status page", withStatus, nil},
		{"edge forwarded", longEdge(), forwarded},
		{"edge refused", refused, nil},
		{"edge forwarded refused", refused, forwarded},
		{"edge busy peers", longEdge(), busyPeers},
		{"edge busy peers refused", refused, busyPeers},
		{"principal", principal, users},
		{"principal with plans", withPlans, planUsers},
		{"chain edge anonymous", chain, nil},
		{"chain edge credentialed", chain, token},
		{"costed route", costed, export},
		{"countStatus route", counted, login},
		{"concurrency allowed", concurrent, nil},
		{"maxDelay allowed", delayAllowed, nil},
		{"maxDelay delayed", delayed, nil},
	}

	for _, sh := range shapes {
		h := build(t, "tierlimit", sh.config, "budget-"+strconv.Itoa(len(sh.name))+sh.name+"@budget")
		check(t, sh.name, allocsPerRequest(h, sh.set))
	}

	// A costFrom route: each request reserves 1 of the route's points, and
	// its response reports 10 in a header, or in a JSON body, which the
	// settlement charges.
	for _, sh := range []struct {
		name, source string
		backend      http.HandlerFunc
	}{
		{"costFrom header route", "header:X-Usage", func(rw http.ResponseWriter, _ *http.Request) {
			rw.Header()["X-Usage"] = []string{"10"}
		}},
		{"costFrom json route", "json:usage.total_tokens", func(rw http.ResponseWriter, _ *http.Request) {
			rw.Header()["Content-Type"] = []string{"application/json"}
			_, _ = rw.Write([]byte(`{"id":"x","usage":{"prompt_tokens":4,"total_tokens":10}}`))
		}},
		{"costFrom gzip json route", "json:usage.total_tokens", func(rw http.ResponseWriter, _ *http.Request) {
			rw.Header()["Content-Type"] = []string{"application/json"}
			rw.Header()["Content-Encoding"] = []string{"gzip"}
			_, _ = rw.Write(gzipUsage)
		}},
		{"costFrom llm sum route", "llm:input + 4*llm:output", func(rw http.ResponseWriter, _ *http.Request) {
			rw.Header()["Content-Type"] = []string{"application/json"}
			_, _ = rw.Write([]byte(`{"id":"x","usage":{"prompt_tokens":4,"completion_tokens":6,"total_tokens":10}}`))
		}},
	} {
		metered := longEdge()
		metered["routes"] = []any{
			map[string]any{"name": "tokens", "paths": []any{"/export"}, "key": "ip", "points": "1000000000", "duration": "1h", "costFrom": sh.source},
		}
		h := buildWith(t, "tierlimit", metered, "budget-"+strconv.Itoa(len(sh.name))+sh.name+"@budget", sh.backend)
		check(t, sh.name, allocsPerRequest(h, export))
	}

	// An LLM gateway's: the costFrom header route beside a concurrency
	// layer, whose answers list every layer (items.go).
	gateway := longEdge()
	gateway["ip"] = concurrent["ip"]
	gateway["routes"] = []any{
		map[string]any{"name": "tokens", "paths": []any{"/export"}, "key": "ip", "points": "1000000000", "duration": "1h", "costFrom": "header:X-Usage"},
	}
	check(t, "costFrom route beside slots", allocsPerRequest(buildWith(t, "tierlimit", gateway, "budget-gateway@budget", http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) {
		rw.Header()["X-Usage"] = []string{"10"}
	})), export))

	t.Logf("a route of cost 1, for reference: %.0f", allocsPerRequest(build(t, "tierlimit", plainRoute, "plainroute@budget"), export))

	// A route keyed by API key and model, the model read from a chat
	// request's body (request/body.go), on the general path.
	jsonKeyed := longEdge()
	jsonKeyed["routes"] = []any{
		map[string]any{"name": "llm", "methods": []any{"POST"}, "paths": []any{"/v1/chat/completions"}, "key": "header:X-Api-Key,json:model", "points": "1000000000", "duration": "1h"},
	}
	chat := []byte(`{"messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"Say hi."}],"model":"gpt-4o","stream":false}`)
	bodies := map[*http.Request]*rewindBody{}
	chatRequest := func(i int, req *http.Request) {
		req.Method = http.MethodPost
		req.URL.Path = "/v1/chat/completions"
		req.Header.Set("X-Api-Key", "key-"+strconv.Itoa(i%10))
		req.ContentLength = int64(len(chat))
		b := &rewindBody{r: bytes.NewReader(chat)}
		b.rc = io.NopCloser(b.r)
		bodies[req] = b
	}
	check(t, "json-keyed route", allocsPerRequestEach(build(t, "tierlimit", jsonKeyed, "jsonkeyed@budget"), chatRequest, func(req *http.Request) {
		b := bodies[req]
		_, _ = b.r.Seek(0, io.SeekStart)
		req.Body = b.rc
	}))

	r, err := harness.StartRedis(t.TempDir())
	if err != nil {
		t.Fatalf("starting redis-server (the e2e tests need it installed): %v", err)
	}
	defer r.Kill()

	cfg := longEdge()
	cfg["store"] = "redis"
	cfg["redis"] = map[string]any{"address": r.Addr, "timeout": "2s"}
	check(t, "redis allowed", allocsPerRequest(build(t, "tierlimit", cfg, "redis@budget"), nil))

	// Refused by a key Redis reported over its limit: no Redis call.
	refusedCfg := longEdge()
	refusedCfg["ip"] = map[string]any{"points": "1", "duration": "1h"}
	refusedCfg["store"] = "redis"
	refusedCfg["redis"] = cfg["redis"]
	check(t, "redis refused", allocsPerRequest(build(t, "tierlimit", refusedCfg, "redisrefused@budget"), nil))
	// global: {store: memory} takes the general path (no redisPath).
	memGlobal := longEdge()
	memGlobal["store"] = "redis"
	memGlobal["redis"] = cfg["redis"]
	memGlobal["global"] = map[string]any{"points": "1000000000", "duration": "1h", "store": "memory"}
	check(t, "redis, global in memory", allocsPerRequest(build(t, "tierlimit", memGlobal, "redismemglobal@budget"), nil))

	// redis.syncInterval: decided in the process, synced in batches. The
	// request path only: an interval of an hour keeps the sync, whose cost
	// is per interval and key, not per request, out of the count.
	synced := longEdge()
	synced["store"] = "redis"
	synced["redis"] = map[string]any{"address": r.Addr, "timeout": "2s", "syncInterval": "1h"}
	check(t, "redis synced allowed", allocsPerRequest(build(t, "tierlimit", synced, "redissynced@budget"), nil))

	// A concurrency layer in Redis: the script call, then its release.
	concurrentRedis := longEdge()
	concurrentRedis["ip"] = concurrent["ip"]
	concurrentRedis["store"] = "redis"
	concurrentRedis["redis"] = cfg["redis"]
	check(t, "concurrency on redis", allocsPerRequest(build(t, "tierlimit", concurrentRedis, "redisconcurrent@budget"), nil))

	// A concurrency layer beside synced counters: global from its lease,
	// the slot in Redis exactly (redisstore/slots.go), then its release.
	concurrentSynced := longEdge()
	concurrentSynced["ip"] = concurrent["ip"]
	concurrentSynced["store"] = "redis"
	concurrentSynced["redis"] = synced["redis"]
	check(t, "concurrency on synced redis", allocsPerRequest(build(t, "tierlimit", concurrentSynced, "redissyncedconcurrent@budget"), nil))

	syncedRefused := longEdge()
	syncedRefused["ip"] = map[string]any{"points": "1", "duration": "1h"}
	syncedRefused["store"] = "redis"
	syncedRefused["redis"] = synced["redis"]
	check(t, "redis synced refused", allocsPerRequest(build(t, "tierlimit", syncedRefused, "redissyncedrefused@budget"), nil))

	checkCluster(t)

	t.Logf("minimal redis limiter, for reference: allowed %.0f",
		allocsPerRequest(build(t, "minimalredis", map[string]any{"address": r.Addr, "seconds": "3600"}, "minimalredis@budget"), nil))

	// Both counted in Redis, not in their memory fallbacks.
	admin := r.Client(redisresp.Options{})
	defer admin.Close()

	for _, key := range []string{"ratelimit:redis@budget:global:global", "minimalredis:minimalredis@budget:global"} {
		if v, err := admin.Do("GET", key); err != nil || v.Str == "" {
			t.Errorf("GET %s: %v, %v: the requests were not counted in Redis", key, v, err)
		}
	}

	checkWithinTwice(t)

	t.Logf("minimal limiter, for reference: allowed %.0f, refused %.0f",
		allocsPerRequest(build(t, "minimal", map[string]any{"seconds": "3600"}, "minimal@budget"), nil),
		allocsPerRequest(build(t, "minimal", map[string]any{"points": "1", "seconds": "3600"}, "minimalrefused@budget"), nil))
}

// withinTwice pairs a shape that charges route or mixed layers with the fast
// path of the same layers without them: the first may cost at most twice
// the second.
var withinTwice = [][2]string{
	{"costed route", "edge allowed"},
	{"countStatus route", "edge allowed"},
	{"redis, global in memory", "redis allowed"},
}

// measured holds check's counts, for withinTwice.
var measured = map[string]float64{}

func checkWithinTwice(t *testing.T) {
	t.Helper()

	for _, pair := range withinTwice {
		got, fast := measured[pair[0]], measured[pair[1]]
		if got == 0 || fast == 0 {
			t.Errorf("%s or %s not measured", pair[0], pair[1])
		} else if got > 2*fast {
			t.Errorf("%s: %.0f allocations per request, over twice %s's %.0f", pair[0], got, pair[1], fast)
		}
	}
}

func check(t *testing.T, name string, got float64) {
	t.Helper()
	t.Logf("%s: %.0f allocations per request (budget %.0f)", name, got, budgets[name])
	measured[name] = got

	if got > budgets[name] {
		t.Errorf("%s: %.0f allocations per request, over its budget of %.0f", name, got, budgets[name])
	}
}

// allocsPerRequest serves 1000 distinct clients twice to start their
// windows, then measures three more passes and keeps the fewest: the count
// is the process's, so a background goroutine (a Redis subscriber's read
// deadline, a pool's dial) can only add to a pass.
func allocsPerRequest(h http.Handler, set func(i int, req *http.Request)) float64 {
	return allocsPerRequestEach(h, set, nil)
}

// rewindBody is a request body served again and again (allocsPerRequestEach).
type rewindBody struct {
	r  *bytes.Reader
	rc io.ReadCloser
}

// allocsPerRequestEach is allocsPerRequest with before (nil: none) called
// before each request is served: to give it back its body, say.
func allocsPerRequestEach(h http.Handler, set func(i int, req *http.Request), before func(req *http.Request)) float64 {
	reqs := requests(1000)
	if set != nil {
		for i, req := range reqs {
			set(i, req)
		}
	}

	w := &sink{h: http.Header{}}
	serve := func(req *http.Request) {
		for k := range w.h {
			delete(w.h, k)
		}

		if before != nil {
			before(req)
		}

		h.ServeHTTP(w, req)
	}

	for pass := 0; pass < 2; pass++ {
		for _, req := range reqs {
			serve(req)
		}
	}

	i := 0
	fewest := 0.0

	// Eight passes of a quarter of the requests each, the fewest kept: what
	// the clock moves (a refusal's Retry-After formatted anew each second, a
	// Redis connection's ping when it has been quiet) lands in some passes,
	// more of them on a loaded machine, never in the requests' own cost.
	for pass := 0; pass < 8; pass++ {
		// A collection empties every sync.Pool (net/http's, Yaegi's), and
		// refilling them allocates: with collections on, the count moves
		// with the heap's size and the machine's pace, not the code.
		runtime.GC()
		old := debug.SetGCPercent(-1)
		n := testing.AllocsPerRun(len(reqs)/4, func() {
			serve(reqs[i%len(reqs)])
			i++
		})
		debug.SetGCPercent(old)
		if pass == 0 || n < fewest {
			fewest = n
		}
	}

	return fewest
}

// checkCluster measures the shapes of a Redis Cluster of three primaries,
// global's key and the clients' in their own slots.
func checkCluster(t *testing.T) {
	t.Helper()

	c, err := harness.StartCluster(t.TempDir(), 3, 0)
	if err != nil {
		t.Fatalf("starting a redis cluster: %v", err)
	}
	defer c.Kill()

	var seeds []any
	for _, s := range c.Seeds() {
		seeds = append(seeds, s)
	}

	cfg := longEdge()
	cfg["store"] = "redis"
	cfg["redis"] = map[string]any{"cluster": map[string]any{"addresses": seeds}, "timeout": "2s"}
	check(t, "cluster allowed", allocsPerRequest(build(t, "tierlimit", cfg, "cluster@budget"), nil))

	refused := longEdge()
	refused["ip"] = map[string]any{"points": "1", "duration": "1h"}
	refused["store"] = "redis"
	refused["redis"] = cfg["redis"]
	check(t, "cluster refused", allocsPerRequest(build(t, "tierlimit", refused, "clusterrefused@budget"), nil))

	synced := longEdge()
	synced["store"] = "redis"
	synced["redis"] = map[string]any{"cluster": map[string]any{"addresses": seeds}, "timeout": "2s", "syncInterval": "1h"}
	check(t, "cluster synced allowed", allocsPerRequest(build(t, "tierlimit", synced, "clustersynced@budget"), nil))
}
