package tierlimit

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/redisresp"
	"github.com/tierlimit/tierlimit/redisstore"
)

// syncHarness is redisHarness with redis.syncInterval: its synced counters
// use the harness's backend and clock, and an interval long enough that the
// goroutine never syncs during the test (the tests call syncNow).
func syncHarness(t *testing.T, addr string, mutate func(c *Config)) (*harness, *syncState, *bytes.Buffer) {
	t.Helper()

	h, logs := redisHarness(t, addr, func(c *Config) {
		c.Redis.SyncInterval = "1h"
		c.IP = LayerConfig{Points: 10, Duration: "60s"}
		if mutate != nil {
			mutate(c)
		}
	})

	rs := h.p.stores.redis
	st := rs.Synced
	if st == nil {
		t.Fatal("redis.syncInterval made no synced store")
	}

	st.Mu.Lock()
	st.Backend, st.Now = rs.Backend, h.clock.Now
	st.Mu.Unlock()

	return h, st, logs
}

// replica is another Traefik process's synced counters on the same backend.
func replica(st *syncState) *syncState {
	r := redisstore.NewSyncState()
	r.Max, r.Backend, r.Interval, r.Now, r.Started = 1000, st.Backend, time.Hour, st.Now, true

	return r
}

// counterOf is st's counter of bucket in the layer called layer, or nil.
func counterOf(st *syncState, layer, bucket string) *syncCounter {
	st.Mu.Lock()
	defer st.Mu.Unlock()

	return st.ByLayer[layer][bucket]
}

// takeOn decides one request of client on st, as the request path does for
// an anonymous request (global if on, then ip), and reports whether it was
// allowed.
func takeOn(st *syncState, h *harness, client string) bool {
	var layers []*layer
	for _, name := range []string{"global", "ip"} {
		if i := layerIndex(h, name); i >= 0 && h.p.layers[i].Points > 0 {
			layers = append(layers, h.p.layers[i])
		}
	}

	var tl tally
	redisstore.SyncTake(st, &tl, chargeOf(layers, client, "", nil, h.clock.Now().UnixNano(), false))

	return !tl.Refused
}

func mustSync(t *testing.T, st *syncState, now int64) {
	t.Helper()

	if err := redisstore.SyncNow(st, now, false); err != nil {
		t.Fatalf("sync: %v", err)
	}
}

// TestSyncedReplicasNeverAdmitMoreThanThePoints: two replicas taking
// turns on one client's key admit its 10 points between them, no more, each
// from leases Redis granted (a quarter of what was left, rounded up, down to
// one point), and Redis counts every point granted. The next window starts
// from nothing, here and in Redis.
func TestSyncedReplicasNeverAdmitMoreThanThePoints(t *testing.T) {
	addr, admin := redisServer(t)
	h, a, _ := syncHarness(t, addr, nil)
	b := replica(a)
	client := "203.0.113.9"

	// The window is aligned to the epoch: 10:00:00 to 10:01:00.
	ip := h.p.layers[layerIndex(h, "ip")]
	key := ip.RedisKey + client + ":" + formatInt(time.Date(2026, 6, 15, 10, 0, 0, 0, time.UTC).UnixMilli())

	allowed := allowedOf(h, client, 30, a, b)

	if allowed != 10 {
		t.Fatalf("two replicas allowed %d of 30 requests, want ip's 10", allowed)
	}

	if got := redisDo(t, admin, "GET", key).Str; got != "10" {
		t.Fatalf("Redis total %q, want the 10 points granted", got)
	}

	if ttl := redisDo(t, admin, "PTTL", key).Int; ttl <= 0 || ttl > 60000+int64(redisstore.KeyGrace/time.Millisecond) {
		t.Fatalf("synced key's TTL %d ms, want the window's rest (+ grace)", ttl)
	}

	for name, st := range map[string]*syncState{"a": a, "b": b} {
		if c := counterOf(st, "ip", client); c.Lease != 0 || c.Remote != 10 {
			t.Fatalf("replica %s: lease %d, remote %d; want 0 and 10", name, c.Lease, c.Remote)
		}
	}

	// The next window: a's first request leases ceil(10/4) = 3 points.
	h.clock.Add(time.Minute)

	if !takeOn(a, h, client) {
		t.Fatal("the next window's first request was refused")
	}

	next := ip.RedisKey + client + ":" + formatInt(time.Date(2026, 6, 15, 10, 1, 0, 0, time.UTC).UnixMilli())
	if got := redisDo(t, admin, "GET", next).Str; got != "3" {
		t.Fatalf("new window's total %q, want the lease of 3", got)
	}

	if a.Size != 1 {
		t.Fatalf("a holds %d counters, want 1", a.Size)
	}

	if c := counterOf(a, "ip", client); c == nil || c.Key != next || c.Lease != 2 || redisstore.Counted(c) != 1 {
		t.Fatalf("a's counter of the new window: %+v, want a lease of 2 left and 1 counted", c)
	}
}

func TestSyncRefusedRequestChargesNoLayer(t *testing.T) {
	addr, admin := redisServer(t)
	h, st, _ := syncHarness(t, addr, func(c *Config) {
		c.Global = LayerConfig{Points: 100, Duration: "60s"}
		c.IP = LayerConfig{Points: 2, Duration: "60s"}
	})

	for i := 0; i < 5; i++ {
		takeOn(st, h, "203.0.113.9")
	}

	// Every lease back: Redis counts what was admitted.
	if err := redisstore.SyncNow(st, h.clock.Now().UnixNano(), true); err != nil {
		t.Fatal(err)
	}

	g := h.p.layers[layerIndex(h, "global")]
	start := formatInt(time.Date(2026, 6, 15, 10, 0, 0, 0, time.UTC).UnixMilli())
	if got := redisDo(t, admin, "GET", g.RedisKey+g.ConstKey+":"+start).Str; got != "2" {
		t.Fatalf("global total %q after 2 allowed and 3 refused requests, want 2", got)
	}
}

func TestFailedSyncKeepsItsCountsAndNeverFailsOpen(t *testing.T) {
	addr, admin := redisServer(t)
	h, st, logs := syncHarness(t, addr, nil)
	client := "203.0.113.9"

	for i := 0; i < 6; i++ {
		takeOn(st, h, client)
	}

	mustSync(t, st, h.clock.Now().UnixNano())

	// Redis goes away: the lease left is spent, then the points admitted
	// without one stay pending, up to the 10 points.
	good := st.Backend.Pool
	down := redisresp.NewPool(redisresp.Options{Address: closedPort(t), Timeout: time.Second})
	st.Backend.Pool = down

	for i := 0; i < 4; i++ {
		if !takeOn(st, h, client) {
			t.Fatalf("request %d of the 4 left refused", i+1)
		}
	}

	if takeOn(st, h, client) {
		t.Fatal("an 11th request allowed while Redis is down")
	}

	now := h.clock.Now().UnixNano()
	if err := redisstore.SyncNow(st, now, false); err == nil {
		t.Fatal("a sync to a closed port succeeded")
	}

	h.clock.Add(50 * time.Millisecond)
	if err := redisstore.SyncNow(st, h.clock.Now().UnixNano(), false); !errors.Is(err, redisstore.ErrSyncSkipped) {
		t.Fatalf("a sync during the back-off: %v, want it skipped", err)
	}

	for _, c := range []*syncCounter{counterOf(st, "ip", client)} {
		if redisstore.Counted(c) != 10 || c.Lease != 0 || c.Inflight != 0 {
			t.Fatalf("after failed syncs: %+v; want 10 counted, no lease, none in flight", c)
		}
	}

	if takeOn(st, h, client) {
		t.Fatal("a request allowed after failed syncs")
	}

	// Redis is back: the probe after the back-off sends the 4.
	st.Backend.Pool = good
	h.clock.Add(time.Second)
	mustSync(t, st, h.clock.Now().UnixNano())

	key := h.p.layers[layerIndex(h, "ip")].RedisKey + client + ":" + formatInt(time.Date(2026, 6, 15, 10, 0, 0, 0, time.UTC).UnixMilli())
	if got := redisDo(t, admin, "GET", key).Str; got != "10" {
		t.Fatalf("Redis total %q after recovery, want 10: the points charged during the outage were lost", got)
	}

	out := logs.String()
	if strings.Count(out, "REDIS_UNAVAILABLE") != 1 || strings.Count(out, "REDIS_RECOVERED") != 1 {
		t.Fatalf("want one REDIS_UNAVAILABLE and one REDIS_RECOVERED:\n%s", out)
	}
}

func TestSyncedCountsSurviveAReload(t *testing.T) {
	addr, _ := redisServer(t)
	name := t.Name() + "@test"
	cfg := CreateConfig()
	cfg.Store = "redis"
	cfg.Redis.Address = addr
	cfg.Redis.SyncInterval = "1h"
	cfg.Global.Points = 0
	cfg.IP = LayerConfig{Points: 3, Duration: "60s"}

	next := http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) {})

	serve := func(handler http.Handler) int {
		rec := (&harness{h: handler}).get("/", "203.0.113.9:1")
		return rec.Code
	}

	ctx1, cancel1 := context.WithCancel(context.Background())
	first, err := New(ctx1, next, cfg, name)
	if err != nil {
		t.Fatal(err)
	}

	for i := 0; i < 3; i++ {
		if code := serve(first); code != http.StatusOK {
			t.Fatalf("request %d: %d", i+1, code)
		}
	}

	// Traefik cancels the old configuration's ctx, then builds the new one.
	cancel1()

	ctx2, cancel2 := context.WithCancel(context.Background())
	defer cancel2()

	second, err := New(ctx2, next, cfg, name)
	if err != nil {
		t.Fatal(err)
	}

	if pluginOf(first).stores.redis.Synced != pluginOf(second).stores.redis.Synced {
		t.Fatal("the reloaded middleware got new synced counters")
	}

	if code := serve(second); code != http.StatusTooManyRequests {
		t.Fatalf("4th request after the reload: %d, want 429 (the local counts were lost)", code)
	}
}

func TestSyncIntervalTakesFixedWindowsOnly(t *testing.T) {
	for name, mutate := range map[string]func(c *Config){
		"sliding":     func(c *Config) { c.IP.Algorithm = "sliding" },
		"tokenbucket": func(c *Config) { c.IP.Algorithm = "tokenbucket" },
		"negative":    func(c *Config) { c.Redis.SyncInterval = "-1s" },
		"garbage":     func(c *Config) { c.Redis.SyncInterval = "often" },
	} {
		cfg := CreateConfig()
		cfg.Store = "redis"
		cfg.Redis.SyncInterval = "100ms"
		mutate(cfg)

		_, err := parse(cfg)
		if err == nil || !strings.Contains(err.Error(), "redis.syncInterval") || !strings.Contains(err.Error(), cfg.Redis.SyncInterval) {
			t.Fatalf("%s: %v, want an error naming redis.syncInterval and its value", name, err)
		}
	}

	for _, zero := range []string{"", "0", "0s", " 0ms "} {
		cfg := CreateConfig()
		cfg.Store = "redis"
		cfg.IP.Algorithm = "sliding"
		cfg.Redis.SyncInterval = zero

		if s, err := parse(cfg); err != nil || s.SyncInterval != 0 {
			t.Fatalf("syncInterval %q: %v, want exact mode", zero, err)
		}
	}

	cfg := CreateConfig()
	cfg.Store = "redis"
	cfg.Redis.SyncInterval = "100ms"
	cfg.IP.Calendar = "day"

	if s, err := parse(cfg); err != nil || s.SyncInterval != 100*time.Millisecond {
		t.Fatalf("fixed and calendar windows: %v", err)
	}
}

func TestResetClearsASyncedKeyHereAndInRedis(t *testing.T) {
	addr, admin := redisServer(t)
	h, st, _ := syncHarness(t, addr, nil)
	// resetKeys names the window of the wall clock, as for calendar keys.
	h.clock.mu.Lock()
	h.clock.now = time.Now()
	h.clock.mu.Unlock()

	client := "203.0.113.9"
	for i := 0; i < 11; i++ {
		takeOn(st, h, client)
	}

	mustSync(t, st, h.clock.Now().UnixNano())

	ip := h.p.layers[layerIndex(h, "ip")]
	start, _ := redisstore.SyncWindow(ip, h.clock.Now().UnixNano())
	key := redisstore.SyncKey(ip, client, false, start)

	if got := redisDo(t, admin, "GET", key).Str; got != "10" {
		t.Fatalf("Redis total %q before the reset, want 10", got)
	}

	r := clearKey(h.p, ip, client)
	if !r.Memory || r.Redis != redisCleared {
		t.Fatalf("reset of a synced key: %+v, want memory and Redis cleared", r)
	}

	if n := redisDo(t, admin, "EXISTS", key).Int; n != 0 {
		t.Fatal("the reset left the synced key in Redis")
	}

	if !takeOn(st, h, client) {
		t.Fatal("the reset client is still refused")
	}
}

func TestSyncedAnonymousPathChargesAllOrNothing(t *testing.T) {
	addr, _ := redisServer(t)
	h, st, _ := syncHarness(t, addr, func(c *Config) {
		c.Global = LayerConfig{Points: 100, Duration: "60s"}
		c.IP = LayerConfig{Points: 3, Duration: "60s"}
	})

	if _, ok := h.h.(*syncedPath); !ok {
		t.Fatalf("a synced anonymous instance is served by %T, want *syncedPath", h.h)
	}

	for i := 1; i <= 5; i++ {
		rec := h.get("/api", "203.0.113.9:1")

		want, remaining := http.StatusOK, strconv.Itoa(3-i)
		if i > 3 {
			want, remaining = http.StatusTooManyRequests, "0"
		}

		if rec.Code != want || rec.Header().Get("X-RateLimit-Remaining") != remaining {
			t.Fatalf("request %d: %d, remaining %q; want %d, %s", i, rec.Code, rec.Header().Get("X-RateLimit-Remaining"), want, remaining)
		}
	}

	// The two refusals (the first reported, the second from the cache)
	// gave global its points back.
	if g, ip := counterOf(st, "global", "global"), counterOf(st, "ip", "203.0.113.9"); g == nil || ip == nil || redisstore.Counted(g) != 3 || redisstore.Counted(ip) != 3 {
		t.Fatalf("counted after 3 allowed and 2 refused: global %+v, ip %+v; want 3 each", g, ip)
	}

	if n := strings.Count(h.events.String(), "RATE_LIMIT_TRIGGERED"); n != 1 {
		t.Fatalf("%d refusal events, want 1 per window:\n%s", n, h.events.String())
	}
}

// TestPanickingSyncKeepsItsLease: a sync cut short by a panic after it
// took a lease to give back (a key no request asked for since the last
// sync) leaves the lease held, and the next sync can run.
func TestPanickingSyncKeepsItsLease(t *testing.T) {
	addr, _ := redisServer(t)
	h, st, _ := syncHarness(t, addr, nil)

	// A lease of a quarter of ip's 10 points, rounded up: 3, one spent.
	if !takeOn(st, h, "203.0.113.9") {
		t.Fatal("the first request was refused")
	}

	if c := counterOf(st, "ip", "203.0.113.9"); c.Lease != 2 {
		t.Fatalf("lease %d after one request, want 2", c.Lease)
	}

	now := h.clock.Now().UnixNano()
	if batch, _ := redisstore.CollectSync(st, now, false); batch != nil {
		t.Fatalf("a sync right after the request sent %+v, want nothing", batch)
	}

	// No request since: the next sync gives the lease back, and panics.
	batch, _ := redisstore.CollectSync(st, now, false)
	if c := counterOf(st, "ip", "203.0.113.9"); len(batch) != 1 || c.Lease != 0 {
		t.Fatalf("collected %d, lease %d; want the idle key's lease going back", len(batch), c.Lease)
	}

	st.Now = func() time.Time { panic("clock") }
	redisstore.SafeSync(st, false)

	if c := counterOf(st, "ip", "203.0.113.9"); c.Lease != 2 || c.Inflight != 0 || st.Syncing {
		t.Fatalf("after a panicking sync: lease %d, in flight %d, syncing %v; want the lease of 2 held", c.Lease, c.Inflight, st.Syncing)
	}
}
