package tierlimit

// Synced counting (redis.syncInterval) through the plugin: its paths, its
// reloads, its resets, and replicas with clocks apart. The synced store's
// own tests (leases, syncs, replicas on one Redis) are redisstore's
// (redisstore/sync_test.go).

import (
	"bytes"
	"context"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/config"
	"github.com/tierlimit/tierlimit/redisresp"
	"github.com/tierlimit/tierlimit/redisstore"
	"github.com/tierlimit/tierlimit/rule"
	"github.com/tierlimit/tierlimit/status"
)

// syncHarness is redisHarness with redis.syncInterval: its synced counters
// use the harness's backend and clock, and an interval long enough that the
// goroutine never syncs during the test (the tests call syncNow).
func syncHarness(t *testing.T, addr string, mutate func(c *Config)) (*harness, *redisstore.SyncState, *bytes.Buffer) {
	t.Helper()

	h, logs := redisHarness(t, addr, func(c *Config) {
		c.Redis.SyncInterval = "1h"
		c.IP = config.LayerConfig{Points: 10, Duration: "60s"}
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
func replica(st *redisstore.SyncState) *redisstore.SyncState {
	r := redisstore.NewSyncState()
	r.Max, r.Backend, r.Interval, r.Now, r.Started = 1000, st.Backend, time.Hour, st.Now, true

	return r
}

// counterOf is st's counter of bucket in the layer called layer, or nil.
func counterOf(st *redisstore.SyncState, layer, bucket string) *redisstore.SyncCounter {
	st.Mu.Lock()
	defer st.Mu.Unlock()

	return st.ByLayer[layer][bucket]
}

// takeOn decides one request of client on st, as the request path does for
// an anonymous request (global if on, then ip), and reports whether it was
// allowed.
func takeOn(st *redisstore.SyncState, h *harness, client string) bool {
	var layers []*rule.Layer
	for _, name := range []string{"global", "ip"} {
		if i := layerIndex(h, name); i >= 0 && h.p.layers[i].Capacity > 0 {
			layers = append(layers, h.p.layers[i])
		}
	}

	var tl rule.Tally
	redisstore.SyncTake(st, &tl, chargeOf(layers, client, "", nil, h.clock.Now().UnixNano(), false))

	return !tl.Refused
}

func mustSync(t *testing.T, st *redisstore.SyncState, now int64) {
	t.Helper()

	if err := redisstore.SyncNow(st, now, false); err != nil {
		t.Fatalf("sync: %v", err)
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
	cfg.IP = config.LayerConfig{Points: 3, Duration: "60s"}

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

	r := status.ClearKey(statusOf(h.p), ip, client, h.clock.Now().UnixNano())
	if !r.Memory || r.Redis != redisstore.RedisCleared {
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
		c.Global = config.LayerConfig{Points: 100, Duration: "60s"}
		c.IP = config.LayerConfig{Points: 3, Duration: "60s"}
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

// TestSyncedCountingChargesTheCost: with redis.syncInterval, an export of
// cost 10 spends 10 of each of its layers' leases; the ip layer's 35 points
// take three exports, not 35, and Redis counts 30 once the leases are back.
func TestSyncedCountingChargesTheCost(t *testing.T) {
	addr, admin := redisServer(t)
	h, st, _ := syncHarness(t, addr, func(c *Config) {
		c.Global = config.LayerConfig{Points: 1000, Duration: "60s"}
		c.IP = config.LayerConfig{Points: 35, Duration: "60s"}
		exportRoute(c)
	})
	client := "203.0.113.9"

	for i, want := range []int{http.StatusOK, http.StatusOK, http.StatusOK, http.StatusTooManyRequests} {
		if rec := h.get("/export", client+":1"); rec.Code != want {
			t.Fatalf("export %d: %d, want %d", i+1, rec.Code, want)
		}
	}

	for _, name := range []string{"global", "ip", "export"} {
		bucket := client
		if name == "global" {
			bucket = "global"
		}

		if c := counterOf(st, name, bucket); c == nil || redisstore.Counted(c) != 30 {
			t.Fatalf("%s's counter %+v, want 30 counted: three exports of cost 10", name, c)
		}
	}

	// Every lease back: Redis counts what was admitted.
	if err := redisstore.SyncNow(st, h.clock.Now().UnixNano(), true); err != nil {
		t.Fatal(err)
	}

	ip := h.p.layers[layerIndex(h, "ip")]
	start, _ := redisstore.SyncWindow(ip, h.clock.Now().UnixNano())
	if got := redisDo(t, admin, "GET", redisstore.SyncKey(ip, client, false, start)).Str; got != "30" {
		t.Fatalf("ip's total in Redis %q, want 30", got)
	}
}

// clusterNode runs a redis-server of the test's own as a one-node Redis
// Cluster that owns every slot, and returns its address and a client for
// checks. Like any Cluster node it refuses a command whose keys are in
// several slots.
func clusterNode(t *testing.T) (string, *redisresp.Pool) {
	t.Helper()

	dir := t.TempDir()
	addr, admin := startRedisServer(t, func(port string) []string {
		return []string{"--dir", dir, "--cluster-enabled", "yes", "--cluster-config-file", "nodes-" + port + ".conf",
			"--cluster-announce-ip", "127.0.0.1"}
	})

	redisDo(t, admin, "CLUSTER", "ADDSLOTSRANGE", "0", "16383")
	waitUntil(t, "the cluster's state ok", func() bool {
		return strings.Contains(redisDo(t, admin, "CLUSTER", "INFO").Str, "cluster_state:ok")
	})

	return addr, admin
}

// TestARefusingReplicaLearnsOfPointsGivenBack: a replica that refuses a key
// for want of room (from its refusal cache, on the anonymous fast path)
// asks again at its next sync, and admits the points another replica gave
// back, then refuses again.
func TestARefusingReplicaLearnsOfPointsGivenBack(t *testing.T) {
	addr, _ := redisServer(t)
	h, a, _ := syncHarness(t, addr, func(c *Config) { c.Global.Points = 0 })
	b := replica(a)
	client := "203.0.113.62"

	if !takeOn(b, h, client) {
		t.Fatal("b's request was refused")
	}

	for i := 1; i <= 9; i++ {
		want := http.StatusOK
		if i > 7 {
			want = http.StatusTooManyRequests // the second from the cache
		}

		if code := h.get("/api", client+":1").Code; code != want {
			t.Fatalf("request %d beside b's lease of 3: %d, want %d", i, code, want)
		}
	}

	now := h.clock.Now().UnixNano()
	mustSync(t, b, now)
	mustSync(t, b, now) // b's key idle: its 2 go back
	mustSync(t, a, now) // a asks again

	// The sync leased 1 of the 2 (a quarter, rounded up); the next request
	// asks for the other.
	for i, want := range []int{http.StatusOK, http.StatusOK, http.StatusTooManyRequests} {
		if code := h.get("/api", client+":1").Code; code != want {
			t.Fatalf("request %d after b gave 2 points back: %d, want %d", i+1, code, want)
		}
	}
}

// TestSyncedKeyAtItsWindowsEnd: the instant a synced key's window ends
// (now == its end) belongs to the next window, as in the memory store (a
// window expires when its expiry <= now) and the Lua scripts (a key whose
// PTTL is 0 is not live): the request is allowed and counted under the
// next window's key, and the ended window's key keeps its count.
func TestSyncedKeyAtItsWindowsEnd(t *testing.T) {
	addr, admin := redisServer(t)
	h, st, _ := syncHarness(t, addr, nil)
	client := "203.0.113.35"
	ip := h.p.layers[layerIndex(h, "ip")]

	for i := 0; i < 11; i++ {
		takeOn(st, h, client)
	}

	mustSync(t, st, h.clock.Now().UnixNano())

	// The harness's clock is 10:00:00.2; the window is 10:00 to 10:01.
	end := time.Date(2026, 6, 15, 10, 1, 0, 0, time.UTC)
	h.clock.Add(end.Sub(h.clock.Now()))
	now := h.clock.Now().UnixNano()

	if c := counterOf(st, "ip", client); c.End != now {
		t.Fatalf("the counter's window ends at %d, the clock is at %d", c.End, now)
	}

	if !takeOn(st, h, client) {
		t.Fatal("a request at the instant its window ended was refused: it belongs to the next window")
	}

	// Every lease back: Redis counts what was admitted.
	if err := redisstore.SyncNow(st, now, true); err != nil {
		t.Fatal(err)
	}

	prev := redisstore.SyncKey(ip, client, false, end.Add(-time.Minute).UnixNano())
	next := redisstore.SyncKey(ip, client, false, end.UnixNano())

	if got := redisDo(t, admin, "GET", next).Str; got != "1" {
		t.Fatalf("the next window's total %q, want 1", got)
	}

	if got := redisDo(t, admin, "GET", prev).Str; got != "10" {
		t.Fatalf("the ended window's total %q, want its 10", got)
	}

	// The memory store draws the same line: a window that started at the
	// first request ends at start + duration, and a request then starts
	// the next.
	m := newHarness(t, func(c *Config) {
		c.Global.Points = 0
		c.IP = config.LayerConfig{Points: 1, Duration: "60s"}
	})
	m.get("/api", client+":1")

	if code := m.get("/api", client+":1").Code; code != 429 {
		t.Fatalf("memory store: a second request of 1 point: %d", code)
	}

	m.clock.Add(time.Minute)

	if code := m.get("/api", client+":1").Code; code != 200 {
		t.Fatalf("memory store: a request at the instant its window ended: %d, want 200", code)
	}
}

// Replicas whose clocks disagree, on one real redis-server: what one
// replica writes must never let another, whose clock is behind, count a
// window again from zero.

// clockedReplicas are two replicas of one middleware on one Redis (conf on
// addr, the second with the first's keys, replicaOf), the first's clock
// ahead of the second's by skew.
func clockedReplicas(t *testing.T, addr string, conf func(c *Config), skew time.Duration) (ahead, behind *harness) {
	t.Helper()

	ahead, _ = redisHarness(t, addr, conf)
	behind, _ = redisHarness(t, addr, conf)
	replicaOf(ahead, behind)

	for _, h := range []*harness{ahead, behind} {
		if rs := h.p.stores.redis; rs.Synced != nil {
			st := rs.Synced
			st.Mu.Lock()
			st.Backend, st.Now = rs.Backend, h.clock.Now
			st.Mu.Unlock()
		}
	}

	ahead.clock.mu.Lock()
	ahead.clock.now = behind.clock.Now().Add(skew)
	ahead.clock.mu.Unlock()

	return ahead, behind
}

// setClock sets h's clock to at.
func setClock(h *harness, at time.Time) {
	h.clock.mu.Lock()
	h.clock.now = at
	h.clock.mu.Unlock()
}

// passTime lets d pass for the replicas and for Redis: each replica's clock
// moves on by d, and every key's TTL is shortened by d (a key with d or
// less left is deleted), as d of Redis's own time would. Redis's TIME does
// not move: use it for TTL-kept state (windows) only, or where a bucket
// refilling later than it would only refuses more.
func passTime(t *testing.T, admin *redisresp.Pool, d time.Duration, replicas ...*harness) {
	t.Helper()

	for _, h := range replicas {
		h.clock.Add(d)
	}

	ms := int64(d / time.Millisecond)
	for _, k := range redisDo(t, admin, "KEYS", "*").Array {
		ttl := redisDo(t, admin, "PTTL", k.Str).Int
		switch {
		case ttl > ms:
			redisDo(t, admin, "PEXPIRE", k.Str, strconv.FormatInt(ttl-ms, 10))
		case ttl > 0:
			redisDo(t, admin, "DEL", k.Str)
		}
	}
}

// sendN sends n requests of client to h and returns how many were allowed.
func sendN(h *harness, client string, n int) int {
	allowed := 0
	for i := 0; i < n; i++ {
		if h.get("/api", client+":1").Code == http.StatusOK {
			allowed++
		}
	}

	return allowed
}

// TestReplicasWithClocksApartNeverAdmitMoreThanThePoints: two replicas
// whose clocks are apart share a key of 10 points in Redis, late in its
// window (fixed windows aligned to the minute with syncInterval, calendar
// periods, exact and synced). The replica ahead gives the key a TTL that
// ends its window early on its own clock; after the one ahead is in its next
// window, the one behind asks again, 3 s before the end of its own. It never
// finds the key gone: over both, the window admits its 10 points. With
// clocks 5 s apart (within redisstore.KeyGrace) in any order; 30 s apart,
// once the replica behind has counted in the key. Windows that Redis times
// (fixed from the first hit, sliding, token buckets) hold as well.
func TestReplicasWithClocksApartNeverAdmitMoreThanThePoints(t *testing.T) {
	addr, admin := redisServer(t)
	minute := utc(2026, 6, 15, 10, 1, 0)

	rows := []struct {
		name  string
		layer config.LayerConfig
		end   time.Time // the end of the window the replica behind starts in
		sync  bool
	}{
		{"fixed", config.LayerConfig{Points: 10, Duration: "60s"}, minute, false},
		{"sliding", config.LayerConfig{Points: 10, Duration: "60s", Algorithm: "sliding"}, minute, false},
		{"tokenbucket", config.LayerConfig{Points: 1, Duration: "1h", Algorithm: "tokenbucket", Burst: 10}, minute, false},
		{"day", config.LayerConfig{Points: 10, Calendar: "day"}, utc(2026, 6, 16, 0, 0, 0), false},
		{"week", config.LayerConfig{Points: 10, Calendar: "week"}, utc(2026, 6, 22, 0, 0, 0), false},
		{"month", config.LayerConfig{Points: 10, Calendar: "month"}, utc(2026, 7, 1, 0, 0, 0), false},
		{"day+07:00", config.LayerConfig{Points: 10, Calendar: "day", UtcOffset: "+07:00"}, utc(2026, 6, 15, 17, 0, 0), false},
		{"synced fixed", config.LayerConfig{Points: 10, Duration: "60s"}, minute, true},
		{"synced day", config.LayerConfig{Points: 10, Calendar: "day"}, utc(2026, 6, 16, 0, 0, 0), true},
		{"synced month+07:00", config.LayerConfig{Points: 10, Calendar: "month", UtcOffset: "+07:00"}, utc(2026, 6, 30, 17, 0, 0), true},
	}

	// What the replicas send before the one ahead leaves the window, in
	// turn: the replica behind first (the one ahead then writes the key's
	// TTL from its clock), the one ahead alone (it makes the key; the one
	// behind comes only late in its window), or the one ahead, the one
	// behind, the one ahead.
	orders := []struct {
		name  string
		sends []int // requests of behind, ahead, behind, ... (0: none)
		apart []time.Duration
	}{
		{"behind first", []int{3, 10}, []time.Duration{5 * time.Second, 30 * time.Second}},
		{"ahead first", []int{0, 10}, []time.Duration{5 * time.Second}},
		{"ahead, behind, ahead", []int{0, 3, 3, 10}, []time.Duration{5 * time.Second, 30 * time.Second}},
	}

	for _, row := range rows {
		for _, order := range orders {
			for _, skew := range order.apart {
				conf := func(c *Config) {
					asACLUser(c)
					c.IP = row.layer
					if row.sync {
						c.Redis.SyncInterval = "1h"
					}
				}

				ahead, behind := clockedReplicas(t, addr, conf, skew)
				setClock(behind, row.end.Add(-skew-5*time.Second))
				setClock(ahead, row.end.Add(-5*time.Second))

				client := "203.0.113.50"
				allowed := 0
				for i, n := range order.sends {
					allowed += sendN([]*harness{behind, ahead}[i%2], client, n)
				}

				// The clock ahead is in its next window, the one behind 3 s
				// from the end of its own.
				passTime(t, admin, skew+2*time.Second, ahead, behind)
				allowed += sendN(behind, client, 10)

				if allowed != 10 {
					t.Errorf("%s, %s, clocks %v apart: %d admitted over two replicas, want the 10 points", row.name, order.name, skew, allowed)
				}
			}
		}
	}
}
