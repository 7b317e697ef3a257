package tierlimit

// The Redis store through the plugin: its outages and replies as requests
// see them, the calls a request makes, the block list, memory layers of a
// Redis instance. The store's own tests (scripts, syncs, leases) are
// redisstore's.

import (
	"bufio"
	"bytes"
	"crypto/sha1"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/config"
	"github.com/tierlimit/tierlimit/rediscall"
	"github.com/tierlimit/tierlimit/redisresp"
	"github.com/tierlimit/tierlimit/redisstore"
	"github.com/tierlimit/tierlimit/rule"
)

// cannedRedis answers every command with reply (raw RESP) and counts commands.
type cannedRedis struct {
	l        net.Listener
	mu       sync.Mutex
	reply    string
	last     []string // the last command's arguments
	commands atomic.Int64
}

func newCannedRedis(t *testing.T, reply string) *cannedRedis {
	t.Helper()

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}

	s := &cannedRedis{l: l, reply: reply}
	t.Cleanup(func() { l.Close() })

	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}

			go s.serve(c)
		}
	}()

	return s
}

func (s *cannedRedis) setReply(r string) {
	s.mu.Lock()
	s.reply = r
	s.mu.Unlock()
}

func (s *cannedRedis) serve(c net.Conn) {
	defer c.Close()

	br := bufio.NewReader(c)

	for {
		// A command is an array of bulk strings.
		line, err := br.ReadString('\n')
		if err != nil {
			return
		}

		n, _ := strconv.Atoi(strings.TrimSpace(line[1:]))
		args := make([]string, 0, n)

		for i := 0; i < n; i++ {
			hdr, err := br.ReadString('\n')
			if err != nil {
				return
			}

			size, _ := strconv.Atoi(strings.TrimSpace(hdr[1:]))
			buf := make([]byte, size+2)

			if _, err := io.ReadFull(br, buf); err != nil {
				return
			}

			args = append(args, string(buf[:size]))
		}

		s.commands.Add(1)
		s.mu.Lock()
		reply := s.reply
		s.last = args
		s.mu.Unlock()

		if _, err := c.Write([]byte(reply)); err != nil {
			return
		}
	}
}

func closedPort(t *testing.T) string {
	t.Helper()

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}

	addr := l.Addr().String()
	l.Close()

	return addr
}

func redisHarness(t *testing.T, addr string, mutate func(c *Config)) (*harness, *bytes.Buffer) {
	t.Helper()

	var cfg *Config

	h := newHarness(t, func(c *Config) {
		cfg = c
		c.Store = "redis"
		c.Redis.Address = addr
		c.Redis.Timeout = "1s"
		c.Global.Points = 0
		c.IP = config.LayerConfig{Points: 3, Duration: "60s"}

		if mutate != nil {
			mutate(c)
		}
	})

	// A backend of its own: the shared registry could hand a later test with
	// a reused port the state of an earlier one.
	s, err := parse(cfg)
	if err != nil {
		t.Fatal(err)
	}

	logs := &bytes.Buffer{}
	pool := redisresp.NewPool(s.Redis)
	h.p.stores.redis.Backend = &redisstore.RedisBackend{Pool: pool, Single: pool, Address: addr, Log: logs}
	if ex := h.p.stores.redis.Exact; ex != nil {
		ex.Backend = h.p.stores.redis.Backend // the slots of a synced store (redisstore/slots.go)
	}

	return h, logs
}

func TestRedisDownIsDecidedInMemoryWithTheSameLimits(t *testing.T) {
	h, logs := redisHarness(t, closedPort(t), nil)

	for i := 1; i <= 6; i++ {
		rec := h.get("/api", "203.0.113.9:1")

		want := http.StatusOK
		if i > 3 {
			want = http.StatusTooManyRequests
		}

		if rec.Code != want || rec.Header().Get("X-RateLimit-Limit") != "3" {
			t.Fatalf("request %d with Redis down: %d %v", i, rec.Code, rec.Header())
		}
	}

	if got := peekCount(h.p.memory, h.clock.Now().UnixNano(), "ip", "203.0.113.9"); got != 3 {
		t.Fatalf("memory fallback count %d, want 3 (the allowed requests; a refused one spends nothing)", got)
	}

	if n := strings.Count(logs.String(), "REDIS_UNAVAILABLE"); n != 1 {
		t.Fatalf("REDIS_UNAVAILABLE logged %d times:\n%s", n, logs.String())
	}
}

func TestBackoffGrowsWhileProbesFailAndEndsOnSuccess(t *testing.T) {
	logs := &bytes.Buffer{}
	b := &redisstore.RedisBackend{Address: "test", Log: logs}
	ms := int64(time.Millisecond)
	now := t0

	if use, probe := b.Usable(now); !use || probe {
		t.Fatal("a healthy backend is not used")
	}

	// Calls in flight when Redis went away all fail: one back-off, one log line.
	for i := 0; i < 10; i++ {
		b.Failed(now, false, io.EOF)
	}

	want := []int64{200, 400, 800, 1600, 3200, 5000, 5000}
	for i, backoff := range want {
		if use, _ := b.Usable(now + backoff*ms - 1); use {
			t.Fatalf("step %d: Redis used before the back-off of %dms ended", i, backoff)
		}

		now += backoff * ms

		use, probe := b.Usable(now)
		if !use || !probe {
			t.Fatalf("step %d: no probe after %dms", i, backoff)
		}

		// One probe at a time.
		if use, _ := b.Usable(now); use {
			t.Fatalf("step %d: a second request probed concurrently", i)
		}

		b.Failed(now, true, io.EOF)
	}

	now += 5000 * ms
	if use, probe := b.Usable(now); !use || !probe {
		t.Fatal("no probe at the capped back-off")
	}

	b.Succeeded(now)

	if use, probe := b.Usable(now); !use || probe {
		t.Fatal("Redis not used after a successful probe")
	}

	if strings.Count(logs.String(), "REDIS_UNAVAILABLE") != 1 || strings.Count(logs.String(), "REDIS_RECOVERED") != 1 {
		t.Fatalf("transitions not logged once each:\n%s", logs.String())
	}
}

func TestMalformedRedisRepliesAreDecidedInMemory(t *testing.T) {
	replies := map[string]string{
		"odd array":             "*1\r\n:1\r\n",
		"empty array":           "*0\r\n",
		"zero count":            "*2\r\n:0\r\n:5000\r\n",
		"negative ttl":          "*2\r\n:1\r\n:-1\r\n",
		"ttl beyond the window": "*2\r\n:1\r\n:60001\r\n",
		"bulk instead of int":   "*2\r\n$1\r\n1\r\n:5000\r\n",
		"status":                "+OK\r\n",
		"script error":          "-ERR boom\r\n",
		"null":                  "*-1\r\n",
		"too many pairs":        "*6\r\n:1\r\n:5000\r\n:1\r\n:5000\r\n:1\r\n:5000\r\n",
		"short without refusal": "*2\r\n:1\r\n:5000\r\n", // two layers charged, one answered
		"not RESP":              "hello\r\n",
		"huge bulk":             "$99999999999\r\n",
		"unterminated":          "*2\r\n:1\r\n:50",
	}

	for name, reply := range replies {
		srv := newCannedRedis(t, reply)
		h, _ := redisHarness(t, srv.l.Addr().String(), func(c *Config) {
			c.Redis.Timeout = "200ms"
			c.Global = config.LayerConfig{Points: 100, Duration: "60s"}
		})

		rec := h.get("/api", "203.0.113.9:1")
		if rec.Code != http.StatusOK || rec.Header().Get("X-RateLimit-Remaining") != "2" {
			t.Errorf("%s: %d %v, want the memory store's decision", name, rec.Code, rec.Header())
		}

		if got := peekCount(h.p.memory, h.clock.Now().UnixNano(), "ip", "203.0.113.9"); got != 1 {
			t.Errorf("%s: memory not charged (count %d) %v", name, got, rec.Header())
		}
	}
}

func TestKeysKnownOverTheirLimitAreRefusedWithoutRedis(t *testing.T) {
	// Redis says: count 4 of 3, 30s left.
	srv := newCannedRedis(t, "*2\r\n:4\r\n:30000\r\n")
	h, _ := redisHarness(t, srv.l.Addr().String(), nil)

	rec := h.get("/api", "203.0.113.9:1")
	if rec.Code != http.StatusTooManyRequests || rec.Header().Get("Retry-After") != "30" {
		t.Fatalf("refusal from Redis: %d %v", rec.Code, rec.Header())
	}

	calls := srv.commands.Load()

	for i := 0; i < 5; i++ {
		rec := h.get("/api", "203.0.113.9:1")
		if rec.Code != http.StatusTooManyRequests || rec.Header().Get("X-RateLimit-Remaining") != "0" {
			t.Fatalf("blocked client: %d %v", rec.Code, rec.Header())
		}
	}

	if srv.commands.Load() != calls {
		t.Fatalf("%d Redis calls for a client known over its limit", srv.commands.Load()-calls)
	}

	if n := strings.Count(h.events.String(), "RATE_LIMIT_TRIGGERED"); n != 1 {
		t.Fatalf("%d events, want 1", n)
	}

	// Another client still goes to Redis; after the reset, so does this one.
	srv.setReply("*2\r\n:1\r\n:60000\r\n")
	h.get("/api", "203.0.113.10:1")

	h.clock.Add(30 * time.Second)

	if rec := h.get("/api", "203.0.113.9:1"); rec.Code != http.StatusOK || srv.commands.Load() != calls+2 {
		t.Fatalf("after the reset: %d, %d calls", rec.Code, srv.commands.Load()-calls)
	}
}

func TestDryRunWithRedisChargesEveryLayerAndNeverBlocks(t *testing.T) {
	srv := newCannedRedis(t, "*4\r\n:1001\r\n:500\r\n:9\r\n:50000\r\n")
	h, _ := redisHarness(t, srv.l.Addr().String(), func(c *Config) {
		c.DryRun = true
		c.Global = config.LayerConfig{Points: 1000, Duration: "1s"}
	})

	for i := 0; i < 3; i++ {
		if rec := h.get("/api", "203.0.113.9:1"); rec.Code != http.StatusOK {
			t.Fatalf("dry run refused: %d", rec.Code)
		}
	}

	if srv.commands.Load() != 3 {
		t.Fatalf("%d calls, want one per request in dry run", srv.commands.Load())
	}

	// Reported once per key and window.
	if strings.Count(h.events.String(), `"limiter":"global"`) != 1 || strings.Count(h.events.String(), `"limiter":"ip"`) != 1 {
		t.Fatalf("events:\n%s", h.events.String())
	}
}

func TestRedisKeysAndArguments(t *testing.T) {
	srv := newCannedRedis(t, "*6\r\n:1\r\n:1000\r\n:1\r\n:60000\r\n:1\r\n:60000\r\n")
	h, _ := redisHarness(t, srv.l.Addr().String(), func(c *Config) {
		c.KeyPrefix = "rl"
		c.Global = config.LayerConfig{Points: 1000, Duration: "1s"}
		c.Routes = []config.RouteConfig{{Name: "auth_login", Paths: []string{"/auth/login"}, Points: 10, Duration: "60s"}}
	})

	store := h.p.stores.redis
	tl := takeIn(store, t0, []*rule.Layer{h.p.planIP[0], h.p.planIP[1], h.p.routes[0].layer}, "2001:db8::/64", "", false)
	if tl.Refused || tl.Shown != 1 || tl.Count != 1 || tl.Reset != t0+int64(time.Minute) {
		t.Fatalf("tally %+v, want ip shown (fewest left), reset from its TTL", tl)
	}

	srv.mu.Lock()
	got := srv.last
	srv.mu.Unlock()

	prefix := "rl:" + h.p.name + ":"
	want := []string{
		"EVALSHA", scriptSHA(redisstore.TakeScript), "3",
		prefix + "global:global", prefix + "ip:2001:db8::/64", prefix + "auth_login:2001:db8::/64",
		"0", "1", "1000", "1000", "0", "0", "3", "60000", "0", "0", "10", "60000", "0", "0",
	}

	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("command\n%q\nwant\n%q", got, want)
	}

	if store.Prefix != "rl:"+h.p.name+":" {
		t.Fatalf("prefix %q", store.Prefix)
	}

}

// A request with no layer to charge (here: anonymous, or carrying a
// credential, on an instance with only the principal tiers) costs no Redis
// call, changes nothing and is no Redis failure.
func TestRequestsWithoutLayersDoNotCallRedis(t *testing.T) {
	s := newCannedRedis(t, "*2\r\n:1\r\n:60000\r\n")
	h, logs := redisHarness(t, s.l.Addr().String(), func(c *Config) {
		c.IP.Points, c.Assets.Points, c.Service.Points = 0, 0, 0
		c.User = config.LayerConfig{Points: 300, Duration: "60s"}
		c.Principal.UserHeader = "X-Auth-User"
		c.Principal.CredentialHeaders = []string{"Authorization"}
	})

	for i := 0; i < 20; i++ {
		anon := h.get("/api", "203.0.113.9:1")
		cred := h.do(http.MethodGet, "/api", "203.0.113.9:1", map[string]string{"Authorization": "Bearer x"})

		for _, rec := range []*httptest.ResponseRecorder{anon, cred} {
			if rec.Code != http.StatusOK || rec.Header().Get("X-RateLimit-Limit") != "" {
				t.Fatalf("request %d without layers: %d %v", i, rec.Code, rec.Header())
			}
		}

		if rec := h.do(http.MethodGet, "/api", "203.0.113.9:1", map[string]string{"X-Auth-User": "bob"}); rec.Code != http.StatusOK ||
			rec.Header().Get("RateLimit-Policy") != `"user";q=300;w=60` {
			t.Fatalf("bob %d: %d %v", i, rec.Code, rec.Header())
		}
	}

	if n := s.commands.Load(); n != 20 {
		t.Fatalf("%d Redis commands for 20 user and 40 layerless requests, want 20", n)
	}

	if logs.Len() != 0 || redisStoreOf(h.p).Backend.Down.Load() {
		t.Fatalf("Redis marked down: %s", logs)
	}
}

// An instance of a replaced configuration may still serve a request after its
// Redis pool was released and closed: memory decides, and Redis is not
// reported down (it is not).
func TestClosedPoolIsDecidedInMemoryWithoutAnEvent(t *testing.T) {
	s := newCannedRedis(t, "*2\r\n:1\r\n:60000\r\n")
	h, logs := redisHarness(t, s.l.Addr().String(), nil)
	redisStoreOf(h.p).Backend.Pool.Close()

	for i := 1; i <= 4; i++ {
		want := http.StatusOK
		if i > 3 {
			want = http.StatusTooManyRequests
		}

		if rec := h.get("/api", "203.0.113.9:1"); rec.Code != want {
			t.Fatalf("request %d on a closed pool: %d, want %d", i, rec.Code, want)
		}
	}

	if logs.Len() != 0 || redisStoreOf(h.p).Backend.Down.Load() || s.commands.Load() != 0 {
		t.Fatalf("closed pool: %d commands, down %v, events %s", s.commands.Load(), redisStoreOf(h.p).Backend.Down.Load(), logs)
	}
}

// A routes-only instance: a request that matches no route has no layer.
func TestUnmatchedRequestOfARoutesOnlyInstanceDoesNotCallRedis(t *testing.T) {
	s := newCannedRedis(t, "*2\r\n:1\r\n:60000\r\n")
	h, logs := redisHarness(t, s.l.Addr().String(), func(c *Config) {
		c.IP.Points, c.Assets.Points, c.User.Points, c.Service.Points = 0, 0, 0, 0
		c.Routes = []config.RouteConfig{{Name: "login", Methods: []string{"POST"}, Paths: []string{"/login"}, Points: 10, Duration: "60s"}}
	})

	for i := 0; i < 5; i++ {
		if rec := h.get("/other", "203.0.113.9:1"); rec.Code != http.StatusOK || rec.Header().Get("X-RateLimit-Limit") != "" {
			t.Fatalf("unmatched %d: %d %v", i, rec.Code, rec.Header())
		}
	}

	if rec := h.do(http.MethodPost, "/login", "203.0.113.9:1", nil); rec.Code != http.StatusOK || rec.Header().Get("X-RateLimit-Limit") != "10" {
		t.Fatalf("login: %d %v", rec.Code, rec.Header())
	}

	if n := s.commands.Load(); n != 1 || logs.Len() != 0 {
		t.Fatalf("%d Redis commands for 5 unmatched requests and 1 login, want 1; events %s", n, logs)
	}
}

// scriptSHA is the name Redis gives a script.
func scriptSHA(src string) string {
	sum := sha1.Sum([]byte(src))
	return hex.EncodeToString(sum[:])
}

// TestCostIsTheScriptsSecondArgument: the request's cost is ARGV[2], after
// the mode, on the general path's encoding and on redisPath's plan alike.
func TestCostIsTheScriptsSecondArgument(t *testing.T) {
	h, _ := redisHarness(t, closedPort(t), nil)
	layers := h.p.planIP

	for _, cost := range []int64{1, 3, 12} {
		want := redisresp.Bulk(strconv.FormatInt(cost, 10)) + layers[0].RedisArgs

		if got := redisstore.EncodeCall(chargeOf(layers, "203.0.113.1", "", nil, 0, false), redisstore.ArgStopAtRefusal, cost); !strings.HasSuffix(got, redisstore.ArgStopAtRefusal+want) {
			t.Fatalf("cost %d: encoded %q", cost, got)
		}

		if rp := newRedisPlan(redisStoreOf(h.p), layers, cost); !strings.HasSuffix(rp.tail, redisstore.ArgOneInteger+want) {
			t.Fatalf("cost %d: plan tail %q", cost, rp.tail)
		}
	}
}

// redisStoreOf is the instance's Redis store (stores.redis), nil without one.
func redisStoreOf(p *Plugin) *redisstore.RedisStore {
	return p.stores.redis
}

// scriptCommands are the commands the scripts run inside Redis.
var scriptCommands = []string{"pttl", "get", "set", "incrby", "decrby", "pexpire", "hmget", "hset", "del", "hincrby", "time"}

// commandCalls reads INFO commandstats: the calls of each command since the
// last CONFIG RESETSTAT, by lower-case name.
func commandCalls(t *testing.T, admin *redisresp.Pool) map[string]int64 {
	t.Helper()

	v := redisDo(t, admin, "INFO", "commandstats")
	calls := map[string]int64{}

	for _, line := range strings.Split(v.Str, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":calls=")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}

		n, err := strconv.ParseInt(strings.SplitN(rest, ",", 2)[0], 10, 64)
		if err != nil {
			t.Fatalf("commandstats line %q: %v", line, err)
		}

		calls[strings.TrimPrefix(name, "cmdstat_")] = n
	}

	return calls
}

// TestTwoCommandsPerFixedKeyOnRedisServer: an allowed request costs each
// fixed-window key at most two commands inside the script (PTTL, then INCRBY
// or SET), counted by the server's commandstats: global + ip, 100 requests
// from 10 clients (new keys and live ones), one script call each.
func TestTwoCommandsPerFixedKeyOnRedisServer(t *testing.T) {
	addr, admin := redisServer(t)

	h, _ := redisHarness(t, addr, func(c *Config) {
		asACLUser(c)
		c.Global = config.LayerConfig{Points: 1000, Duration: "1h"}
		c.IP = config.LayerConfig{Points: 1000, Duration: "1h"}
	})

	// A first request loads the script (EVALSHA, NOSCRIPT, then EVAL).
	req := httptest.NewRequest(http.MethodGet, "/api", nil)
	req.RemoteAddr = "203.0.113.200:1"
	h.h.ServeHTTP(httptest.NewRecorder(), req)

	redisDo(t, admin, "CONFIG", "RESETSTAT")

	const requests = 100

	for i := 0; i < requests; i++ {
		req := httptest.NewRequest(http.MethodGet, "/api", nil)
		req.RemoteAddr = "203.0.113." + strconv.Itoa(1+i%10) + ":1"
		rec := httptest.NewRecorder()
		h.h.ServeHTTP(rec, req)

		if rec.Code != http.StatusOK {
			t.Fatalf("request %d: %d", i, rec.Code)
		}
	}

	calls := commandCalls(t, admin)

	var inside int64
	for _, c := range scriptCommands {
		inside += calls[c]
	}

	if scripts := calls["evalsha"] + calls["eval"]; scripts != requests {
		t.Fatalf("%d script calls for %d requests (commandstats %v)", scripts, requests, calls)
	}

	if inside > 2*2*requests {
		t.Fatalf("%d commands inside the script for %d requests of 2 fixed keys, want at most %d (commandstats %v)", inside, requests, 2*2*requests, calls)
	}

	t.Logf("%d requests, 2 fixed keys: %d commands inside the script (%v)", requests, inside, calls)
}

func TestClusterKeysShareASlotPerClientAndPrincipal(t *testing.T) {
	mk := func(name string, kind int) *rule.Layer {
		return &rule.Layer{Limits: rule.Limits{Name: name, KeyKind: kind, ConstKey: "global"}, Encoding: &rediscall.Encoding{RedisKey: "ratelimit:mw:" + name + ":"}}
	}

	ip, login, byPrincipal, global := mk("ip", keyOfClient), mk("login", keyOfClient), mk("upload", rule.KeyOfPrincipalElseClient), mk("global", keyOfConst)

	if k := redisstore.ClusterKey(ip, rule.KeyFor(ip, "198.51.100.7", "", nil)); k != "ratelimit:mw:ip:{198.51.100.7}" {
		t.Fatalf("ip key %q", k)
	}

	anon := redisstore.ClusterKey(byPrincipal, rule.KeyFor(byPrincipal, "198.51.100.7", "", nil))
	if redisresp.Slot(anon) != redisresp.Slot(redisstore.ClusterKey(ip, rule.KeyFor(ip, "198.51.100.7", "", nil))) ||
		redisresp.Slot(redisstore.ClusterKey(login, rule.KeyFor(login, "198.51.100.7", "", nil))) != redisresp.Slot(anon) {
		t.Fatalf("one client's layers in different slots: %q", anon)
	}

	if k := redisstore.ClusterKey(byPrincipal, rule.KeyFor(byPrincipal, "198.51.100.7", "alice", nil)); k != "ratelimit:mw:upload:{alice}" {
		t.Fatalf("principal key %q", k)
	}

	if k := redisstore.ClusterKey(global, rule.KeyFor(global, "198.51.100.7", "alice", nil)); k != "ratelimit:mw:global:{global}" {
		t.Fatalf("global key %q", k)
	}
}

// TestFallbackStartsFromWhatRedisLastReported: a key Redis had at 7 of 10
// when it went away gets 3 more from memory, not 10, for every algorithm and
// on both paths (modeRedis for a fixed ip layer, the general path for the
// others).
func TestFallbackStartsFromWhatRedisLastReported(t *testing.T) {
	for _, algorithm := range []string{"fixed", "sliding", "tokenbucket"} {
		addr, admin := redisServer(t)
		h, logs := redisHarness(t, addr, func(c *Config) {
			asACLUser(c)
			c.IP = algorithmLayer(algorithm, 10)
		})

		if (algorithm == "fixed") != (h.p.mode == modeRedis) {
			t.Fatalf("%s: mode %d", algorithm, h.p.mode)
		}

		client := "203.0.113.7"
		for i := 0; i < 7; i++ {
			if rec := h.get("/api", client+":1"); rec.Code != http.StatusOK {
				t.Fatalf("%s: request %d refused by Redis: %d", algorithm, i+1, rec.Code)
			}
		}

		if v := redisDo(t, admin, "EXISTS", h.p.layers[0].RedisKey+client); v.Int != 1 {
			t.Fatalf("%s: not counted in Redis", algorithm)
		}

		_, _ = admin.Do("SHUTDOWN", "NOSAVE")

		allowed := 0
		for i := 0; i < 10; i++ {
			if rec := h.get("/api", client+":1"); rec.Code == http.StatusOK {
				allowed++
			}
		}

		if allowed != 3 {
			t.Errorf("%s: memory allowed %d after Redis went away at 7 of 10, want 3", algorithm, allowed)
		}

		if !strings.Contains(logs.String(), "REDIS_UNAVAILABLE") {
			t.Errorf("%s: not decided in memory:\n%s", algorithm, logs)
		}
	}
}

// TestMemoryLayerOnRedisServer: global with store: memory on a Redis
// instance is counted in memory, never in Redis; a request ip refuses (in
// Redis) spends no global point, and one global refuses (in memory) calls
// no Redis and spends no ip point.
func TestMemoryLayerOnRedisServer(t *testing.T) {
	addr, admin := redisServer(t)

	h, _ := redisHarness(t, addr, func(c *Config) {
		asACLUser(c)
		c.Global = config.LayerConfig{Points: 3, Duration: "1h", Store: "memory"}
		c.IP = config.LayerConfig{Points: 2, Duration: "1h"}
	})

	if _, ok := h.h.(*mixedPath); !ok || !h.p.stores.mixed {
		t.Fatalf("handler %T, mixed %v: want the mixed store on mixedPath", h.h, h.p.stores.mixed)
	}

	now := h.clock.Now().UnixNano()
	global := func() int64 { return peekCount(h.p.memory, now, "global", "global") }

	for i, want := range []int{http.StatusOK, http.StatusOK, http.StatusTooManyRequests} {
		if rec := h.get("/api", "203.0.113.1:1"); rec.Code != want || rec.Code == http.StatusTooManyRequests && refusedLayer(rec) != "ip" {
			t.Fatalf("request %d from .1: %d (%s), want %d", i, rec.Code, refusedLayer(rec), want)
		}
	}

	if n := global(); n != 2 {
		t.Fatalf("global at %d after 2 allowed and 1 refused by ip, want 2", n)
	}

	if rec := h.get("/api", "203.0.113.2:1"); rec.Code != http.StatusOK || global() != 3 {
		t.Fatalf("request from .2: %d, global at %d, want 200 and 3", rec.Code, global())
	}

	calls := scriptCalls(t, admin)

	if rec := h.get("/api", "203.0.113.3:1"); rec.Code != http.StatusTooManyRequests || refusedLayer(rec) != "global" {
		t.Fatalf("request from .3: %d (%s), want refused by global", rec.Code, refusedLayer(rec))
	}

	if scriptCalls(t, admin) != calls || global() != 3 {
		t.Fatalf("the global refusal called Redis (%d script calls, %d before) or changed global (%d)", scriptCalls(t, admin), calls, global())
	}

	for _, k := range redisDo(t, admin, "KEYS", "*").Array {
		if strings.Contains(k.Str, ":global") {
			t.Fatalf("global is in Redis: %s", k.Str)
		}
	}

	if n := redisDo(t, admin, "GET", h.p.planIP[1].RedisKey+"203.0.113.1").Str; n != "2" {
		t.Fatalf("ip of .1 in Redis %q, want 2", n)
	}

	if n := redisDo(t, admin, "EXISTS", h.p.planIP[1].RedisKey+"203.0.113.3").Int; n != 0 {
		t.Fatalf("ip of .3, which global refused, is in Redis")
	}
}

// TestMemoryLayerWhileRedisIsDown: with Redis unreachable, the Redis layers
// fall back to memory and the rule holds across them: ip's refusal (in the
// fallback) gives global (a memory layer) its point back.
func TestMemoryLayerWhileRedisIsDown(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}

	addr := l.Addr().String()
	l.Close()

	h, logs := redisHarness(t, addr, func(c *Config) {
		c.Global = config.LayerConfig{Points: 3, Duration: "1h", Store: "memory"}
		c.IP = config.LayerConfig{Points: 2, Duration: "1h"}
	})

	now := h.clock.Now().UnixNano()

	for i, want := range []int{http.StatusOK, http.StatusOK, http.StatusTooManyRequests} {
		if rec := h.get("/api", "203.0.113.1:1"); rec.Code != want {
			t.Fatalf("request %d: %d, want %d", i, rec.Code, want)
		}
	}

	if !strings.Contains(logs.String(), "REDIS_UNAVAILABLE") {
		t.Fatalf("logs %q: want Redis reported unavailable", logs)
	}

	if g, ip := peekCount(h.p.memory, now, "global", "global"), peekCount(h.p.memory, now, "ip", "203.0.113.1"); g != 2 || ip != 2 {
		t.Fatalf("memory holds global %d, ip %d, want 2 and 2", g, ip)
	}
}

// TestMemoryRouteAfterRedisLayersOnRedisServer: a memory layer after the
// Redis ones (a route) is charged all or nothing with them too: its refusal
// charges no Redis layer, and Redis's refusal gives its point back.
func TestMemoryRouteAfterRedisLayersOnRedisServer(t *testing.T) {
	addr, admin := redisServer(t)

	h, _ := redisHarness(t, addr, func(c *Config) {
		asACLUser(c)
		c.Global = config.LayerConfig{Points: 100, Duration: "1h"}
		c.IP = config.LayerConfig{Points: 2, Duration: "1h"}
		c.Routes = []config.RouteConfig{{Name: "login", Paths: []string{"/login"}, Key: "ip", Points: 1, Duration: "1h", Store: "memory"}}
	})

	now := h.clock.Now().UnixNano()
	global := h.p.planIP[0].RedisKey + "global"

	for i, step := range []struct {
		path, client string
		code         int
		global       string
	}{
		{"/login", "203.0.113.1:1", http.StatusOK, "1"},
		{"/login", "203.0.113.1:1", http.StatusTooManyRequests, "1"}, // login (memory) refuses: Redis untouched
		{"/api", "203.0.113.1:1", http.StatusOK, "2"},
		{"/api", "203.0.113.3:1", http.StatusOK, "3"},
		{"/api", "203.0.113.3:1", http.StatusOK, "4"},
		{"/login", "203.0.113.3:1", http.StatusTooManyRequests, "4"}, // ip (Redis) refuses: login given back
	} {
		rec := h.get(step.path, step.client)
		if rec.Code != step.code {
			t.Fatalf("step %d: %d (%s), want %d", i, rec.Code, refusedLayer(rec), step.code)
		}

		if g := redisDo(t, admin, "GET", global).Str; g != step.global {
			t.Fatalf("step %d: global %q in Redis, want %s", i, g, step.global)
		}
	}

	if n := peekCount(h.p.memory, now, "login", "203.0.113.3"); n != 0 {
		t.Fatalf("login of .3 at %d after ip refused its only request, want 0", n)
	}
}

// A Redis Cluster through the plugin: the paths its slots take.

// clusterOfThree runs a Redis Cluster of three redis-server processes of the
// test's own, each the primary of a third of the slots, with README's ACL
// user on each, and returns their addresses and a client of each for
// checks.
func clusterOfThree(t *testing.T) ([]string, []*redisresp.Pool) {
	t.Helper()

	dir := t.TempDir()

	var addrs []string
	var admins []*redisresp.Pool
	var buses []string

	for i := 0; i < 3; i++ {
		_, bus, _ := net.SplitHostPort(closedPort(t))
		addr, admin := startRedisServer(t, func(port string) []string {
			return []string{"--dir", dir, "--cluster-enabled", "yes", "--cluster-config-file", "nodes-" + port + ".conf",
				"--cluster-announce-ip", "127.0.0.1", "--cluster-port", bus, "--cluster-node-timeout", "1000"}
		})
		redisDo(t, admin, readmeACL(t)...)

		from, to := i*redisresp.Slots/3, (i+1)*redisresp.Slots/3-1
		redisDo(t, admin, "CLUSTER", "ADDSLOTSRANGE", strconv.Itoa(from), strconv.Itoa(to))

		addrs = append(addrs, addr)
		admins = append(admins, admin)
		buses = append(buses, bus)
	}

	for i := 1; i < 3; i++ {
		_, port, _ := net.SplitHostPort(addrs[i])
		redisDo(t, admins[0], "CLUSTER", "MEET", "127.0.0.1", port, buses[i])
	}

	waitUntil(t, "cluster_state:ok on the three nodes", func() bool {
		for _, admin := range admins {
			info := redisDo(t, admin, "CLUSTER", "INFO").Str
			if !strings.Contains(info, "cluster_state:ok") || !strings.Contains(info, "cluster_known_nodes:3\r\n") {
				return false
			}
		}

		return true
	})

	return addrs, admins
}

// onCluster is a mutate of newHarness: the Redis store on the Cluster of
// addrs, as README's ACL user.
func onCluster(addrs []string) func(c *Config) {
	return func(c *Config) {
		c.Store = "redis"
		c.Redis.Cluster = &config.RedisClusterConfig{Addresses: addrs}
		c.Redis.Timeout = "2s"
		asACLUser(c)
	}
}

// scriptCallsOn is scriptCalls summed over a Cluster's nodes.
func scriptCallsOn(t *testing.T, admins []*redisresp.Pool) int64 {
	t.Helper()

	var n int64
	for _, admin := range admins {
		n += scriptCalls(t, admin)
	}

	return n
}

// TestSyncedCountingOnAClusterTakesTheSyncedPath: with global and ip in
// Redis on a Cluster, their keys in two slots, redis.syncInterval serves
// requests on syncedPath, as on one server: a request makes no Redis call
// once its counters hold leases, and the leases' calls go to each key's
// node.
func TestSyncedCountingOnAClusterTakesTheSyncedPath(t *testing.T) {
	addrs, admins := clusterOfThree(t)

	h := newHarness(t, func(c *Config) {
		onCluster(addrs)(c)
		c.Redis.SyncInterval = "1h"
		c.Global = config.LayerConfig{Points: 1000, Duration: "1h"}
		c.IP = config.LayerConfig{Points: 100, Duration: "1h"}
	})

	if fmt.Sprintf("%T", h.h) != "*tierlimit.syncedPath" {
		t.Fatalf("handler %T, want syncedPath", h.h)
	}

	clients := []string{"203.0.113.1", "203.0.113.2", "203.0.113.3", "203.0.113.4"}
	for _, client := range clients {
		if rec := h.get("/api", client+":1"); rec.Code != http.StatusOK {
			t.Fatalf("%s's first request: %d, want 200", client, rec.Code)
		}
	}

	before := scriptCallsOn(t, admins)

	for i := 0; i < 10; i++ {
		for _, client := range clients {
			if rec := h.get("/api", client+":1"); rec.Code != http.StatusOK {
				t.Fatalf("%s's request %d: %d, want 200", client, i, rec.Code)
			}
		}
	}

	if n := scriptCallsOn(t, admins) - before; n != 0 {
		t.Fatalf("40 requests on leases made %d script calls, want 0", n)
	}
}

// nodeOf is the index, in clusterOfThree's nodes, of the node that serves
// key's slot.
func nodeOf(key string) int {
	slot := redisresp.Slot(key)
	for i := 2; i > 0; i-- {
		if slot >= i*redisresp.Slots/3 {
			return i
		}
	}

	return 0
}

// clusterKeys are the Redis keys of global and of client's ip layer on a
// Cluster (redisstore.ClusterKey).
func clusterKeys(h *harness, client string) (string, string) {
	return h.p.planIP[0].RedisKey + "{global}", h.p.planIP[1].RedisKey + "{" + client + "}"
}

// clientsOnOtherNodes returns n client addresses whose ip key is on
// another node than global's key.
func clientsOnOtherNodes(h *harness, n int) []string {
	var out []string

	for i := 1; len(out) < n; i++ {
		client := "198.51.100." + strconv.Itoa(i)
		global, ip := clusterKeys(h, client)
		if nodeOf(ip) != nodeOf(global) {
			out = append(out, client)
		}
	}

	return out
}

// TestExactCountingOnAClusterSendsEachSlotItsCallTogether: with global and
// ip in Redis on a Cluster, an allowed request is charged on clusterPath,
// one call on global's node and one on the client's, sent together, and no
// other call: global's count is every request's, each client's its own.
func TestExactCountingOnAClusterSendsEachSlotItsCallTogether(t *testing.T) {
	addrs, admins := clusterOfThree(t)

	h := newHarness(t, func(c *Config) {
		onCluster(addrs)(c)
		c.Global = config.LayerConfig{Points: 1000, Duration: "1h"}
		c.IP = config.LayerConfig{Points: 100, Duration: "1h"}
	})

	if fmt.Sprintf("%T", h.h) != "*tierlimit.clusterPath" {
		t.Fatalf("handler %T, want clusterPath", h.h)
	}

	clients := clientsOnOtherNodes(h, 4)
	// The first calls read the map, make the pools and load the script.
	for _, client := range clients {
		if rec := h.get("/api", client+":1"); rec.Code != http.StatusOK {
			t.Fatalf("%s's first request: %d, want 200", client, rec.Code)
		}
	}

	before := scriptCallsOn(t, admins)

	for i := 0; i < 5; i++ {
		for _, client := range clients {
			rec := h.get("/api", client+":1")
			if rec.Code != http.StatusOK || rec.Header().Get("X-RateLimit-Remaining") != strconv.Itoa(100-2-i) {
				t.Fatalf("%s's request %d: %d, X-RateLimit-Remaining %q, want 200, %d", client, i, rec.Code, rec.Header().Get("X-RateLimit-Remaining"), 100-2-i)
			}
		}
	}

	if n := scriptCallsOn(t, admins) - before; n != 2*20 {
		t.Fatalf("20 requests made %d script calls, want 40 (one per slot each)", n)
	}

	global, _ := clusterKeys(h, "")
	if v := redisDo(t, admins[nodeOf(global)], "GET", global).Str; v != "24" {
		t.Fatalf("global in Redis %q, want 24", v)
	}

	for _, client := range clients {
		_, ip := clusterKeys(h, client)
		if v := redisDo(t, admins[nodeOf(ip)], "GET", ip).Str; v != "6" {
			t.Fatalf("%s in Redis %q, want 6", ip, v)
		}
	}

	// The calls are clusterPath's, not the general path's: global's asks
	// for the one-integer reply (ARGV[1] "2", the general path's "0").
	if line := monitored(t, addrs[nodeOf(global)], func() { h.get("/api", clients[0]+":1") }); !strings.Contains(line, `{global}" "2" "1"`) {
		t.Fatalf("global's call %s, want its one-integer form", line)
	}

	// An asset: global and assets, the assets plan's pair of calls.
	if rec := h.get("/assets/app.js", clients[0]+":1"); rec.Code != http.StatusOK {
		t.Fatalf("an asset: %d, want 200", rec.Code)
	}

	assets := h.p.planAssets[1].RedisKey + "{" + clients[0] + "}"
	if v := redisDo(t, admins[nodeOf(assets)], "GET", assets).Str; v != "1" {
		t.Fatalf("%s in Redis %q, want 1", assets, v)
	}

	if n := scriptCallsOn(t, admins) - before; n != 2*22 {
		t.Fatalf("22 requests made %d script calls, want 44 (one per slot each)", n)
	}
}

// TestAClusterNeverAdmitsOverThePointsAcrossSlots: requests of many
// clients at once, their keys in other slots than global's: global admits no more than its points, no client more than
// ip's, and what Redis holds at the end is what was admitted, every
// refused request's charge in the other slot given back.
func TestAClusterNeverAdmitsOverThePointsAcrossSlots(t *testing.T) {
	addrs, admins := clusterOfThree(t)

	a := newHarness(t, func(c *Config) {
		onCluster(addrs)(c)
		c.Global = config.LayerConfig{Points: 60, Duration: "1h"}
		c.IP = config.LayerConfig{Points: 5, Duration: "1h"}
	})

	clients := clientsOnOtherNodes(a, 16)
	allowed := map[string]int{}
	var mu sync.Mutex
	var wg sync.WaitGroup

	for w := 0; w < 8; w++ {
		w := w
		wg.Add(1)

		go func() {
			defer wg.Done()

			for i := 0; i < 20; i++ {
				client := clients[(w*5+i)%len(clients)]

				rec := httptest.NewRecorder()
				req := httptest.NewRequest(http.MethodGet, "/api", nil)
				req.RemoteAddr = client + ":1"
				a.h.ServeHTTP(rec, req)

				if rec.Code == http.StatusOK {
					mu.Lock()
					allowed[client]++
					mu.Unlock()
				}
			}
		}()
	}

	wg.Wait()

	total := 0
	for _, client := range clients {
		total += allowed[client]
		if allowed[client] > 5 {
			t.Errorf("%s admitted %d times, over ip's 5", client, allowed[client])
		}

		_, ip := clusterKeys(a, client)
		if v := redisDo(t, admins[nodeOf(ip)], "GET", ip).Str; v != strconv.Itoa(allowed[client]) && !(v == "" && allowed[client] == 0) {
			t.Errorf("%s in Redis %q, want %d (its admitted requests)", ip, v, allowed[client])
		}
	}

	if total > 60 {
		t.Errorf("%d admitted, over global's 60", total)
	}

	global, _ := clusterKeys(a, "")
	if v := redisDo(t, admins[nodeOf(global)], "GET", global).Str; v != strconv.Itoa(total) {
		t.Errorf("global in Redis %q, want %d (the admitted requests)", v, total)
	}
}

// TestARefusalInOneSlotLeavesTheOtherSlotUnchanged: on a Cluster, a request
// that ip refuses leaves global's count (another slot, another node) as it
// was, and one that global refuses leaves the client's ip count as it was.
func TestARefusalInOneSlotLeavesTheOtherSlotUnchanged(t *testing.T) {
	addrs, admins := clusterOfThree(t)

	h := newHarness(t, func(c *Config) {
		onCluster(addrs)(c)
		c.Global = config.LayerConfig{Points: 4, Duration: "1h"}
		c.IP = config.LayerConfig{Points: 2, Duration: "1h"}
	})

	clients := clientsOnOtherNodes(h, 3)
	global, _ := clusterKeys(h, "")
	get := func(key string) string { return redisDo(t, admins[nodeOf(key)], "GET", key).Str }

	for i, want := range []int{http.StatusOK, http.StatusOK, http.StatusTooManyRequests} {
		if rec := h.get("/api", clients[0]+":1"); rec.Code != want {
			t.Fatalf("%s's request %d: %d, want %d", clients[0], i, rec.Code, want)
		}
	}

	if v := get(global); v != "2" {
		t.Fatalf("global in Redis %q after 2 requests allowed and 1 that ip refused, want 2", v)
	}

	for _, client := range clients[1:] {
		if rec := h.get("/api", client+":1"); rec.Code != http.StatusOK {
			t.Fatalf("%s's request: %d, want 200", client, rec.Code)
		}
	}

	// global is full (4): the next client's request is refused by global.
	_, ip := clusterKeys(h, clients[2])
	if rec := h.get("/api", clients[2]+":1"); rec.Code != http.StatusTooManyRequests || refusedLayer(rec) != "global" {
		t.Fatalf("%s's second request: %d refused by %q, want 429 by global", clients[2], rec.Code, refusedLayer(rec))
	}

	if v := get(ip); v != "1" {
		t.Fatalf("%s in Redis %q after 1 request allowed and 1 that global refused, want 1", ip, v)
	}

	if v := get(global); v != "4" {
		t.Fatalf("global in Redis %q, want 4", v)
	}
}

// TestAClusterNodeDownMidRequestIsDecidedInMemory: the node of a client's
// slot shuts down between two of its requests, its pooled connections
// with it: the next request's call fails in the middle, and that request
// and the next are decided in memory with the same limits (never a 5xx,
// never over ip's points), one REDIS_UNAVAILABLE reported.
func TestAClusterNodeDownMidRequestIsDecidedInMemory(t *testing.T) {
	addrs, admins := clusterOfThree(t)

	var logs bytes.Buffer
	h := newHarness(t, func(c *Config) {
		onCluster(addrs)(c)
		c.Global = config.LayerConfig{Points: 100, Duration: "1h"}
		c.IP = config.LayerConfig{Points: 3, Duration: "1h"}
	})
	h.p.stores.redis.Backend.Log = &logs

	client := clientsOnOtherNodes(h, 1)[0]
	_, ip := clusterKeys(h, client)

	if rec := h.get("/api", client+":1"); rec.Code != http.StatusOK {
		t.Fatalf("first request: %d, want 200", rec.Code)
	}

	_, _ = admins[nodeOf(ip)].Do("SHUTDOWN", "NOSAVE")

	for i, want := range []int{http.StatusOK, http.StatusOK, http.StatusTooManyRequests} {
		if rec := h.get("/api", client+":1"); rec.Code != want {
			t.Fatalf("request %d after the node went down: %d, want %d\n%s", i, rec.Code, want, logs.String())
		}
	}

	if n := strings.Count(logs.String(), `"REDIS_UNAVAILABLE"`); n != 1 {
		t.Fatalf("%d REDIS_UNAVAILABLE, want 1:\n%s", n, logs.String())
	}
}

// monitored runs do while MONITOR watches the node at addr, and returns the
// first script call the node ran.
func monitored(t *testing.T, addr string, do func()) string {
	t.Helper()

	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	r := bufio.NewReader(c)
	if _, err := c.Write([]byte("MONITOR\r\n")); err != nil {
		t.Fatal(err)
	}

	if line, err := r.ReadString('\n'); err != nil || line != "+OK\r\n" {
		t.Fatalf("MONITOR: %q, %v", line, err)
	}

	do()

	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))

	for {
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatalf("no script call seen: %v", err)
		}

		if strings.Contains(line, `"EVALSHA"`) || strings.Contains(line, `"evalsha"`) {
			return line
		}
	}
}
