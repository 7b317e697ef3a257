package tierlimit

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/config"
	"github.com/tierlimit/tierlimit/events"
	"github.com/tierlimit/tierlimit/memstore"
	"github.com/tierlimit/tierlimit/rediscall"
	"github.com/tierlimit/tierlimit/redisresp"
	"github.com/tierlimit/tierlimit/redisstore"
	"github.com/tierlimit/tierlimit/request"
	"github.com/tierlimit/tierlimit/rule"
)

// resetDoc is the reset's answer as an operator reads it (the names are the
// contract).
type resetDoc struct {
	Error     string  `json:"error"`
	Parameter string  `json:"parameter"`
	Layer     string  `json:"layer"`
	Key       string  `json:"key"`
	Memory    bool    `json:"memory"`
	BlockList bool    `json:"blockList"`
	Redis     *string `json:"redis"`
}

// reset posts a reset from remote (a local one by default) and decodes its
// answer, checking what every answer of the endpoint shares.
func (h *harness) reset(query, remote string) (int, resetDoc) {
	h.t.Helper()

	if remote == "" {
		remote = local
	}

	calls := h.calls.Load()
	rec := h.do(http.MethodPost, "/_rl/reset"+query, remote, nil)

	if h.calls.Load() != calls || rec.Header().Get("Content-Type") != "application/json" ||
		rec.Header().Get("Cache-Control") != "no-store" || rec.Header().Get("X-RateLimit-Limit") != "" {
		h.t.Fatalf("POST /_rl/reset%s: %d %v %s (backend reached: %v)", query, rec.Code, rec.Header(), rec.Body, h.calls.Load() != calls)
	}

	var doc resetDoc
	if err := json.Unmarshal(rec.Body.Bytes(), &doc); err != nil {
		h.t.Fatalf("POST /_rl/reset%s: %v\n%s", query, err, rec.Body)
	}

	return rec.Code, doc
}

// A client the ip layer (2 points) refuses is let in again by a reset of its
// key, and only its key: in memory, for every algorithm.
func TestResetLetsARefusedClientInAgain(t *testing.T) {
	for _, algorithm := range []string{"fixed", "sliding", "tokenbucket"} {
		h := statusHarness(t, func(c *Config) { c.IP = algorithmLayer(algorithm, 2) })
		client, other := "203.0.113.7", "203.0.113.8"

		h.burst(client, 3)
		h.burst(other, 2)

		if rec := h.get("/api", client+":1"); rec.Code != http.StatusTooManyRequests {
			t.Fatalf("%s: the client is not refused before the reset: %d", algorithm, rec.Code)
		}

		code, doc := h.reset("?layer=ip&key="+client, "")
		if code != http.StatusOK || doc.Layer != "ip" || doc.Key != client || !doc.Memory || doc.BlockList || doc.Redis != nil || doc.Error != "" {
			t.Fatalf("%s: reset: %d %+v", algorithm, code, doc)
		}

		for i := 1; i <= 3; i++ {
			want := http.StatusOK
			if i == 3 {
				want = http.StatusTooManyRequests // a fresh counter, of the same limit
			}

			if rec := h.get("/api", client+":1"); rec.Code != want {
				t.Fatalf("%s: request %d after the reset: %d, want %d", algorithm, i, rec.Code, want)
			}
		}

		if rec := h.get("/api", other+":1"); rec.Code != http.StatusTooManyRequests {
			t.Fatalf("%s: the reset cleared another key: %d", algorithm, rec.Code)
		}

		if !strings.Contains(h.events.String(), `{"time":"`+events.EventTime(h.clock.Now().UnixNano())+`","event":"RATE_LIMIT_RESET","severity":"info","limiter":"ip","key":"203.0.113.7","operator":"127.0.0.1","middleware":"`+h.p.name+`","memory":true,"blockList":false}`) {
			t.Fatalf("%s: events:\n%s", algorithm, h.events)
		}
	}
}

// Nothing to clear: a key never seen, or one reset already, or one whose
// window is over.
func TestResetOfNothingIs404(t *testing.T) {
	h := statusHarness(t, func(c *Config) { c.IP = config.LayerConfig{Points: 2, Duration: "60s"} })
	h.burst("203.0.113.7", 1)
	h.burst("203.0.113.9", 1)

	if code, doc := h.reset("?layer=ip&key=198.51.100.1", ""); code != http.StatusNotFound || doc.Error != "nothing to reset" || doc.Memory || doc.Key != "198.51.100.1" {
		t.Fatalf("unknown key: %d %+v", code, doc)
	}

	if code, _ := h.reset("?layer=ip&key=203.0.113.7", ""); code != http.StatusOK {
		t.Fatalf("first reset: %d", code)
	}

	if code, _ := h.reset("?layer=ip&key=203.0.113.7", ""); code != http.StatusNotFound {
		t.Fatalf("second reset: %d", code)
	}

	h.clock.Add(61 * time.Second)

	if code, doc := h.reset("?layer=ip&key=203.0.113.9", ""); code != http.StatusNotFound || doc.Memory {
		t.Fatalf("a window that is over: %d %+v", code, doc)
	}

	if n := strings.Count(h.events.String(), "RATE_LIMIT_RESET"); n != 4 {
		t.Fatalf("%d reset events, want one per reset:\n%s", n, h.events)
	}
}

// The key is the status page's: a principal-keyed route's key of an
// anonymous request, a hashed header value (and the IP of a request without
// the header), "global".
func TestResetTakesTheKeysTheStatusPageShows(t *testing.T) {
	h := statusHarness(t, func(c *Config) {
		c.Global = config.LayerConfig{Points: 100, Duration: "60s"}
		c.IP = config.LayerConfig{Points: 50, Duration: "60s", Key: "header:X-Api-Key"}
		c.Routes = []config.RouteConfig{{Name: "login", Paths: []string{"/login"}, Key: "principal", Points: 1, Duration: "60s"}}
	})

	h.do(http.MethodGet, "/api", "203.0.113.7:1", map[string]string{"X-Api-Key": "secret"})
	h.get("/login", "203.0.113.7:1")

	if rec := h.get("/login", "203.0.113.7:1"); rec.Code != http.StatusTooManyRequests {
		t.Fatalf("login not refused: %d", rec.Code)
	}

	shown := map[string]bool{}
	for _, it := range h.status("/_rl").Keys.Items {
		shown[it.Layer+"/"+it.Key] = true
	}

	for _, lk := range [][2]string{{"login", "ip:203.0.113.7"}, {"ip", request.HashKey("secret")}, {"ip", "203.0.113.7"}, {"global", "global"}} {
		if !shown[lk[0]+"/"+lk[1]] {
			t.Fatalf("%s/%s not on the status page: %v", lk[0], lk[1], shown)
		}

		if code, doc := h.reset("?layer="+lk[0]+"&key="+strings.ReplaceAll(lk[1], ":", "%3A"), ""); code != http.StatusOK || !doc.Memory {
			t.Fatalf("reset %s/%s: %d %+v", lk[0], lk[1], code, doc)
		}
	}

	if doc := h.status("/_rl"); doc.Keys.Total != 0 {
		t.Fatalf("keys left: %+v", doc.Keys.Items)
	}

	if rec := h.get("/login", "203.0.113.7:1"); rec.Code != http.StatusOK {
		t.Fatalf("login after the reset: %d", rec.Code)
	}
}

func TestResetNamesABadParameter(t *testing.T) {
	h := statusHarness(t, nil)
	h.burst("203.0.113.7", 1)

	for _, c := range []struct{ query, parameter, msg string }{
		{"", "layer", "missing query parameter layer"},
		{"?key=203.0.113.7", "layer", "missing query parameter layer"},
		{"?layer=ip", "key", "missing query parameter key"},
		{"?layer=ip&key=", "key", "missing query parameter key"},
		{"?layer=nope&key=203.0.113.7", "layer", "unknown layer nope"},
		{"?layer=user&key=alice", "layer", "unknown layer user"}, // off in this instance
	} {
		if code, doc := h.reset(c.query, ""); code != http.StatusBadRequest || doc.Parameter != c.parameter || doc.Error != c.msg {
			t.Errorf("%q: %d %+v", c.query, code, doc)
		}
	}

	if doc := h.status("/_rl"); doc.Keys.Total != 1 || strings.Contains(h.events.String(), "RATE_LIMIT_RESET") {
		t.Fatalf("a bad reset changed something: %+v\n%s", doc.Keys, h.events)
	}
}

func TestResetIsPostOnly(t *testing.T) {
	h := statusHarness(t, nil)
	h.burst("203.0.113.7", 1)

	for _, m := range []string{http.MethodGet, http.MethodHead, http.MethodPut, http.MethodDelete, http.MethodPatch, http.MethodOptions} {
		rec := h.do(m, "/_rl/reset?layer=ip&key=203.0.113.7", local, nil)
		if rec.Code != http.StatusMethodNotAllowed || rec.Header().Get("Allow") != "POST" || h.calls.Load() != 1 {
			t.Errorf("%s: %d %v (backend calls %d)", m, rec.Code, rec.Header(), h.calls.Load())
		}
	}

	if doc := h.status("/_rl"); doc.Keys.Total != 1 || doc.Keys.Items[0].Count != 1 {
		t.Fatalf("a refused method reset the key: %+v", doc.Keys)
	}

	// Only the exact path resets.
	for _, path := range []string{"/_rl/reset/", "/_rl/resetx", "/_rl/metrics/reset"} {
		calls := h.calls.Load()
		if rec := h.do(http.MethodPost, path+"?layer=ip&key=203.0.113.7", local, nil); h.calls.Load() != calls+1 || rec.Header().Get("X-RateLimit-Limit") != "5" {
			t.Errorf("POST %s: not an ordinary request: %d %v", path, rec.Code, rec.Header())
		}
	}
}

// A reset from a client outside allowedIPs, or one that wrote an allowed
// address itself, is an ordinary request: passed on, charged, and the
// refused key stays refused.
func TestResetFollowsTheStatusPageAddressRule(t *testing.T) {
	h := statusHarness(t, func(c *Config) { c.IP = config.LayerConfig{Points: 2, Duration: "60s"} })
	h.burst("203.0.113.7", 3)

	for _, c := range []struct{ remote, xff string }{
		{"203.0.113.1:1", ""},
		{"203.0.113.1:1", "127.0.0.1"},   // written by an untrusted peer
		{"192.168.1.9:1", "127.0.0.1"},   // written by a client in the trusted ranges
		{"127.0.0.1:1", "198.51.100.20"}, // through a local proxy, for an outside client
	} {
		hdr := map[string]string{}
		if c.xff != "" {
			hdr["X-Forwarded-For"] = c.xff
		}

		calls := h.calls.Load()
		rec := h.do(http.MethodPost, "/_rl/reset?layer=ip&key=203.0.113.7", c.remote, hdr)

		if h.calls.Load() != calls+1 || rec.Header().Get("X-RateLimit-Limit") != "2" || strings.Contains(rec.Body.String(), "memory") {
			t.Errorf("%s %q: not an ordinary request: %d %v %s", c.remote, c.xff, rec.Code, rec.Header(), rec.Body)
		}

		if rec := h.get("/api", "203.0.113.7:1"); rec.Code != http.StatusTooManyRequests {
			t.Fatalf("%s %q: the key was reset: %d", c.remote, c.xff, rec.Code)
		}
	}

	if strings.Contains(h.events.String(), "RATE_LIMIT_RESET") {
		t.Fatalf("events:\n%s", h.events)
	}
}

// On a real redis-server, a reset deletes the key in Redis, whoever charged
// it, and the block list entry, for every algorithm.
func TestResetClearsRedisAndTheBlockListOnRedisServer(t *testing.T) {
	addr, admin := redisServer(t)

	for _, algorithm := range []string{"fixed", "sliding", "tokenbucket"} {
		h, _ := redisHarness(t, addr, func(c *Config) {
			asACLUser(c)
			c.Status.Path = "/_rl"
			c.IP = algorithmLayer(algorithm, 2)
		})
		client := "203.0.113.7"
		key := h.p.layers[0].RedisKey + client

		h.burst(client, 3)

		if redisDo(t, admin, "EXISTS", key).Int != 1 || redisStoreOf(h.p).Blocked.ResetOf(h.p.layers[0].BlockPrefix, client, h.clock.Now().UnixNano()) == 0 {
			t.Fatalf("%s: the refusal left no key in Redis or no block list entry", algorithm)
		}

		code, doc := h.reset("?layer=ip&key="+client, "")
		// Memory too: it remembers what Redis reported (redisstore/fallback.go).
		if code != http.StatusOK || !doc.Memory || !doc.BlockList || doc.Redis == nil || *doc.Redis != "cleared" {
			t.Fatalf("%s: reset: %d %+v", algorithm, code, doc)
		}

		if redisDo(t, admin, "EXISTS", key).Int != 0 {
			t.Fatalf("%s: the Redis key is still there", algorithm)
		}

		if rec := h.get("/api", client+":1"); rec.Code != http.StatusOK {
			t.Fatalf("%s: refused after the reset: %d", algorithm, rec.Code)
		}

		if !strings.Contains(h.events.String(), `"redis":"cleared"`) {
			t.Fatalf("%s: events:\n%s", algorithm, h.events)
		}

		// A key only Redis holds (another instance's charge) is cleared too.
		redisDo(t, admin, "SET", h.p.layers[0].RedisKey+"198.51.100.4", "2", "PX", "60000")

		if code, doc := h.reset("?layer=ip&key=198.51.100.4", ""); code != http.StatusOK || *doc.Redis != "cleared" || doc.Memory || doc.BlockList {
			t.Fatalf("%s: another instance's key: %d %+v", algorithm, code, doc)
		}

		if code, doc := h.reset("?layer=ip&key=198.51.100.4", ""); code != http.StatusNotFound || *doc.Redis != "absent" {
			t.Fatalf("%s: nothing left: %d %+v", algorithm, code, doc)
		}

		redisDo(t, admin, "FLUSHALL")
	}
}

// With Redis down the reset clears what this Traefik holds (the fallback's
// counter), says Redis could not be reached, and answers 503.
func TestResetWithRedisDownIs503(t *testing.T) {
	h, logs := redisHarness(t, closedPort(t), func(c *Config) { c.Status.Path = "/_rl" })
	h.burst("203.0.113.9", 4) // decided in memory

	code, doc := h.reset("?layer=ip&key=203.0.113.9", "")
	if code != http.StatusServiceUnavailable || !doc.Memory || doc.Redis == nil || *doc.Redis != "unavailable" || !strings.HasPrefix(doc.Error, "redis unavailable") {
		t.Fatalf("reset: %d %+v", code, doc)
	}

	if !strings.Contains(logs.String(), `"event":"REDIS_RESET_FAILED"`) || !strings.Contains(h.events.String(), `"redis":"unavailable"`) {
		t.Fatalf("logs:\n%s\nevents:\n%s", logs, h.events)
	}

	if rec := h.get("/api", "203.0.113.9:1"); rec.Code != http.StatusOK {
		t.Fatalf("the fallback still refuses: %d", rec.Code)
	}

	// A closed pool (a replaced configuration's) is unavailable too, and
	// nothing panics.
	redisStoreOf(h.p).Backend.Pool.Close()

	if code, doc := h.reset("?layer=ip&key=203.0.113.9", ""); code != http.StatusServiceUnavailable || *doc.Redis != "unavailable" {
		t.Fatalf("closed pool: %d %+v", code, doc)
	}
}

// The cluster key a reset deletes is the one clusterKey charges, for every
// kind of key.
func TestResetClusterKeyIsTheChargedOne(t *testing.T) {
	req := httptest.NewRequest(http.MethodGet, "http://api.example/", nil)
	req.Header.Set("X-Api-Key", "secret")

	for _, kind := range []int{keyOfClient, rule.KeyOfPrincipal, keyOfConst, rule.KeyOfPrincipalElseClient, rule.KeyOfHeader, rule.KeyOfHost} {
		l := &rule.Layer{Limits: rule.Limits{Name: "l", KeyKind: kind, ConstKey: "global", KeyHeader: "X-Api-Key"}, Encoding: &rediscall.Encoding{RedisKey: "ratelimit:mw:l:"}}

		for _, principal := range []string{"", "alice"} {
			bucket := rule.KeyFor(l, "198.51.100.7", principal, req)
			if got, want := redisstore.ResetClusterKey(l, bucket), redisstore.ClusterKey(l, rule.KeyFor(l, "198.51.100.7", principal, req)); got != want || redisresp.Slot(got) != redisresp.Slot(want) {
				t.Errorf("kind %d, principal %q: reset deletes %q, charged %q", kind, principal, got, want)
			}
		}
	}
}

// A calendar layer's reset deletes the key of the period that holds the
// instance's clock (p.now), the one its requests charged, whatever the
// wall clock says.
func TestResetOfACalendarKeyUsesTheInstanceClockOnRedisServer(t *testing.T) {
	addr, admin := redisServer(t)
	h, _ := redisHarness(t, addr, func(c *Config) {
		c.Status.Path = "/_rl"
		c.IP = config.LayerConfig{Points: 2, Calendar: "day"}
	})
	h.clock.mu.Lock()
	h.clock.now = utc(2026, 2, 10, 12, 0, 0) // not today, so not time.Now's period
	h.clock.mu.Unlock()

	client := "203.0.113.7"
	h.burst(client, 3)

	key := h.p.layers[0].RedisKey + client + ":" + strconv.FormatInt(utc(2026, 2, 10, 0, 0, 0).Unix(), 10)
	if redisDo(t, admin, "EXISTS", key).Int != 1 {
		t.Fatalf("no Redis key %s", key)
	}

	if code, doc := h.reset("?layer=ip&key="+client, ""); code != http.StatusOK || doc.Redis == nil || *doc.Redis != redisstore.RedisCleared {
		t.Fatalf("reset: %d %+v", code, doc)
	}

	if redisDo(t, admin, "EXISTS", key).Int != 0 {
		t.Fatalf("the period's key %s outlived the reset", key)
	}
}

// TestResetIsPublishedWhenRedisHasNoKey: a reset reaches the other
// replicas even when Redis holds no key for it (its window ended there, or
// the counts were the memory fallback's): replica B, which counted and
// blocked the client in its memory fallback, forgets it.
func TestResetIsPublishedWhenRedisHasNoKey(t *testing.T) {
	addr, admin := redisServer(t)
	h, _ := redisHarness(t, addr, func(c *Config) {
		asACLUser(c)
		c.Status.Path = "/_rl"
		c.IP = config.LayerConfig{Points: 2, Duration: "1h"}
	})
	a := h.p.stores.redis

	// Replica B: the same middleware with a backend, a block list and a
	// memory fallback of its own (as in
	// TestResetReachesAnotherReplicasBlockListOnRedisServer).
	bb := redisstore.NewBackend(redisresp.Options{Address: addr, Username: "tierlimit", Password: aclPassword, Timeout: time.Second})
	bb.Log = &bytes.Buffer{}
	b := &redisstore.RedisStore{Prefix: a.Prefix, Name: a.Name, Channel: a.Channel, Backend: bb, Local: memstore.NewWindowStore(100), Blocked: redisstore.NewBlockList(100), Calls: a.Calls}
	b.Blocks = false
	b.Clock = time.Now
	t.Cleanup(func() { redisstore.CloseBackend(bb) })

	l := h.p.layers[0]
	client := "203.0.113.40"
	now := time.Now().UnixNano()
	req := httptest.NewRequest(http.MethodGet, "/api", nil)

	// B decided the client in memory during an outage: 2 counted, then
	// refused and blocked; Redis never saw the client.
	for i := 0; i < 2; i++ {
		var tl rule.Tally
		take(storeOf(b.Local), &tl, chargeOf([]*rule.Layer{l}, client, "", req, now, false))
	}

	b.Blocked.Add(l.BlockPrefix, client, now+int64(time.Hour), now)
	redisstore.ListenResets(b)

	waitUntil(t, "B subscribes", func() bool {
		return redisDo(t, admin, "PUBSUB", "NUMSUB", a.Channel).Array[1].Int == 1
	})

	if n := redisDo(t, admin, "EXISTS", l.RedisKey+client).Int; n != 0 {
		t.Fatal("Redis holds the client's key")
	}

	if code, doc := h.reset("?layer=ip&key="+client, ""); doc.Redis == nil || *doc.Redis != redisstore.RedisAbsent {
		t.Fatalf("reset: %d %+v, want Redis absent", code, doc)
	}

	waitUntil(t, "B forgets the key it blocked", func() bool { return b.Blocked.ResetOf(l.BlockPrefix, client, now) == 0 })

	if got := peekCount(b.Local, now, "ip", client); got != 0 {
		t.Fatalf("B's memory fallback still counts %d for the client", got)
	}
}

// TestResetIsPublishedToASyncedReplicaWhenRedisHasNoKey: a synced
// replica B refused a client on charges it has not synced yet, so Redis
// holds no key of the client's window; a reset through A reaches B all the
// same, and B lets the client in again.
func TestResetIsPublishedToASyncedReplicaWhenRedisHasNoKey(t *testing.T) {
	addr, admin := redisServer(t)
	h, st, _ := syncHarness(t, addr, func(c *Config) {
		asACLUser(c)
		c.Status.Path = "/_rl"
	})
	a := h.p.stores.redis

	bb := redisstore.NewBackend(redisresp.Options{Address: addr, Username: "tierlimit", Password: aclPassword, Timeout: time.Second})
	bb.Log = &bytes.Buffer{}
	bst := replica(st)
	// B decides without Redis (its charges pending), so that Redis holds
	// no key of the client.
	bst.Backend = nil
	b := &redisstore.RedisStore{Prefix: a.Prefix, Name: a.Name, Channel: a.Channel, Backend: bb, Local: memstore.NewWindowStore(100), Blocked: redisstore.NewBlockList(100), Calls: a.Calls, Synced: bst}
	b.Blocks = false
	b.Clock = h.clock.Now
	t.Cleanup(func() { redisstore.CloseBackend(bb) })

	client := "203.0.113.47"
	for i := 0; i < 10; i++ {
		takeOn(bst, h, client)
	}

	if takeOn(bst, h, client) {
		t.Fatal("B allowed an 11th request")
	}

	redisstore.ListenResets(b)
	waitUntil(t, "B subscribes", func() bool {
		return redisDo(t, admin, "PUBSUB", "NUMSUB", a.Channel).Array[1].Int == 1
	})

	ip := h.p.layers[layerIndex(h, "ip")]
	start, _ := redisstore.SyncWindow(ip, h.clock.Now().UnixNano())
	if n := redisDo(t, admin, "EXISTS", redisstore.SyncKey(ip, client, false, start)).Int; n != 0 {
		t.Fatal("Redis holds the client's key")
	}

	if code, doc := h.reset("?layer=ip&key="+client, ""); doc.Redis == nil || *doc.Redis != redisstore.RedisAbsent {
		t.Fatalf("reset: %d %+v, want Redis absent", code, doc)
	}

	waitUntil(t, "B forgets the key", func() bool { return counterOf(bst, "ip", client) == nil })

	if !takeOn(bst, h, client) {
		t.Fatal("B still refuses the client after the reset")
	}
}

// The reset key of a route keyed by ip is the client's address, bare, as
// the status page lists it (docs/operations.md): a reset of it lets a
// client the route refused in again, on memory and on Redis; an IPv6
// client's key is its /64 prefix.
func TestResetOfAnIPKeyedRouteTakesTheBareAddress(t *testing.T) {
	login := func(c *Config) {
		c.Routes = []config.RouteConfig{{Name: "auth_login", Methods: []string{"POST"}, Paths: []string{"/auth/login"}, Key: "ip", Points: 2, Duration: "60s"}}
		c.Status.Path = "/_rl"
	}

	addr, _ := redisServer(t)
	redisLogin, _ := redisHarness(t, addr, with(login, asACLUser))

	for store, h := range map[string]*harness{"memory": statusHarness(t, login), "redis": redisLogin} {
		for remote, key := range map[string]string{"203.0.113.7:1": "203.0.113.7", "[2001:db8::7]:1": "2001:db8::/64"} {
			codes := []int{}
			for i := 0; i < 3; i++ {
				codes = append(codes, h.do(http.MethodPost, "/auth/login", remote, nil).Code)
			}

			if codes[2] != http.StatusTooManyRequests {
				t.Fatalf("%s, %s: logins %v, want the 3rd refused", store, remote, codes)
			}

			listed := false
			for _, k := range h.status("/_rl?q=" + url.QueryEscape(key)).Keys.Items {
				listed = listed || k.Layer == "auth_login" && k.Key == key
			}

			if !listed {
				t.Errorf("%s: the status page does not list auth_login's key %q", store, key)
			}

			if code, doc := h.reset("?layer=auth_login&key="+url.QueryEscape(key), ""); code != http.StatusOK || !doc.Memory {
				t.Fatalf("%s: reset of auth_login key %s: %d %+v", store, key, code, doc)
			}

			if rec := h.do(http.MethodPost, "/auth/login", remote, nil); rec.Code != http.StatusOK {
				t.Errorf("%s, %s: login after the reset: %d", store, remote, rec.Code)
			}
		}
	}
}

// A reset message clears the key's block list entries of the layer it names,
// under whatever limits they were made, and the key's memory window, for the
// middleware it names only.
func TestResetMessageClearsTheNamedKeyOnly(t *testing.T) {
	now := t0
	reset := now + int64(time.Hour)
	bl := redisstore.NewBlockList(100)
	ws := memstore.NewWindowStore(100)
	l := testLayer(ws, "ip", 1, time.Hour)
	other := testLayer(ws, "ipx", 1, time.Hour)
	req := httptest.NewRequest(http.MethodGet, "/", nil)

	bl.Add("ip\x00points 5\x00", "203.0.113.7", reset, now)
	bl.Add("ip\x00points 9\x00", "203.0.113.7", reset, now) // before a reload changed the limits
	bl.Add("ip\x00points 5\x00", "203.0.113.8", reset, now)
	bl.Add("ipx\x00points 5\x00", "203.0.113.7", reset, now)

	for _, lay := range []*rule.Layer{l, other} {
		var tl rule.Tally
		take(storeOf(ws), &tl, chargeOf([]*rule.Layer{lay}, "203.0.113.7", "", req, now, false))
	}

	// A block the memory fallback started (takeLocal), and the
	// middleware's clock, which the reset reads instead of time.Now.
	ws.Blocks["ip"]["203.0.113.7"] = reset
	ws.Blocks["ip"]["203.0.113.8"] = reset
	clockReads := 0
	clock := func() time.Time { clockReads++; return time.Unix(0, now) }

	r := redisstore.NewResetListener(&redisstore.RedisBackend{}, redisresp.Options{})
	r.Targets["ratelimit:resets"] = map[string]redisstore.ResetForget{"edge@file": redisstore.ForgetIn(bl, ws, clock)}

	// Another middleware's, another channel's and a malformed message.
	r.Dispatch(redisresp.Message{Channel: "ratelimit:resets", Payload: redisstore.ResetMessage("other@file", "ip", "203.0.113.7")})
	r.Dispatch(redisresp.Message{Channel: "other:resets", Payload: redisstore.ResetMessage("edge@file", "ip", "203.0.113.7")})
	r.Dispatch(redisresp.Message{Channel: "ratelimit:resets", Payload: "edge@file ip 203.0.113.7"})

	if bl.Size.Load() != 4 || peekCount(ws, now, "ip", "203.0.113.7") != 1 {
		t.Fatalf("a message for someone else cleared something: %d entries, %v", bl.Size.Load(), bl.Until)
	}

	r.Dispatch(redisresp.Message{Channel: "ratelimit:resets", Payload: redisstore.ResetMessage("edge@file", "ip", "203.0.113.7")})

	if bl.ResetOf("ip\x00points 5\x00", "203.0.113.7", now) != 0 || bl.ResetOf("ip\x00points 9\x00", "203.0.113.7", now) != 0 {
		t.Fatalf("the key is still blocked: %v", bl.Until)
	}

	if bl.ResetOf("ip\x00points 5\x00", "203.0.113.8", now) != reset || bl.ResetOf("ipx\x00points 5\x00", "203.0.113.7", now) != reset {
		t.Fatalf("another key or layer was cleared: %v", bl.Until)
	}

	if _, ok := ws.Blocks["ip"]["203.0.113.7"]; ok || ws.Blocks["ip"]["203.0.113.8"] != reset {
		t.Fatalf("the memory fallback's blocks after the reset: %v", ws.Blocks["ip"])
	}

	if clockReads == 0 {
		t.Fatal("the reset did not read the middleware's clock")
	}

	if peekCount(ws, now, "ip", "203.0.113.7") != 0 || peekCount(ws, now, "ipx", "203.0.113.7") != 1 {
		t.Fatal("the memory windows: the key's is kept, or another layer's went")
	}
}

// Two replicas on one redis-server: each refused the client itself, so
// each blocks it locally. A reset through A reaches B's block list and
// memory fallback through the channel, and B lets the client in again. B
// subscribes only once it blocks a key, and stops when its backend is
// released.
func TestResetReachesAnotherReplicasBlockListOnRedisServer(t *testing.T) {
	addr, admin := redisServer(t)
	h, _ := redisHarness(t, addr, func(c *Config) {
		asACLUser(c)
		c.Status.Path = "/_rl"
		c.IP = config.LayerConfig{Points: 2, Duration: "1h"}
	})
	a := h.p.stores.redis

	// Replica B: the same middleware (name, layers, keys) with a backend, a
	// block list and a memory fallback of its own.
	bb := redisstore.NewBackend(redisresp.Options{Address: addr, Username: "tierlimit", Password: aclPassword, Timeout: time.Second})
	bb.Log = &bytes.Buffer{}
	b := &redisstore.RedisStore{Prefix: a.Prefix, Name: a.Name, Channel: a.Channel, Backend: bb, Local: memstore.NewWindowStore(100), Blocked: redisstore.NewBlockList(100), Calls: a.Calls}
	b.Blocks = false
	b.Clock = time.Now
	layers := h.p.layers[:1]
	client, other := "203.0.113.7", "203.0.113.8"
	now := h.clock.Now().UnixNano()

	take := func(s *redisstore.RedisStore, client string) rule.Tally {
		var tl rule.Tally
		take(storeOf(s), &tl, chargeOf(layers, client, "", httptest.NewRequest(http.MethodGet, "/api", nil), now, false))
		return tl
	}

	numsub := func() int64 {
		v := redisDo(t, admin, "PUBSUB", "NUMSUB", a.Channel)
		return v.Array[1].Int
	}

	h.burst(client, 2)
	take(b, other)
	take(b, other)

	if numsub() != 0 {
		t.Fatal("a replica without block list entries subscribed")
	}

	if h.get("/api", client+":1").Code != http.StatusTooManyRequests || !take(b, client).Refused || !take(b, other).Refused {
		t.Fatal("the clients are not refused")
	}

	var memory rule.Tally
	memstore.Take(b.Local, &memory, chargeOf(layers, client, "", nil, now, false))

	waitUntil(t, "B subscribes", func() bool { return numsub() == 1 })

	if code, doc := h.reset("?layer=ip&key="+client, ""); code != http.StatusOK || !doc.BlockList {
		t.Fatalf("reset: %d %+v", code, doc)
	}

	waitUntil(t, "B forgets the key", func() bool { return b.Blocked.ResetOf(layers[0].BlockPrefix, client, now) == 0 })

	if peekCount(b.Local, now, "ip", client) != 0 {
		t.Fatal("B's memory fallback still counts the key")
	}

	if b.Blocked.ResetOf(layers[0].BlockPrefix, other, now) == 0 {
		t.Fatal("B forgot another key")
	}

	if tl := take(b, client); tl.Refused || h.get("/api", client+":1").Code != http.StatusOK {
		t.Fatal("the client is refused after the reset")
	}

	redisstore.CloseBackend(bb)
	waitUntil(t, "B unsubscribes once released", func() bool { return numsub() == 0 })
}

// waitUntil polls cond until it holds, failing after a generous bound: for
// what another goroutine does, never for a window.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()

	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out: %s", what)
		}
	}
}
