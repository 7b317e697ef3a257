package tierlimit

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/events"
	"github.com/tierlimit/tierlimit/redisresp"
	"github.com/tierlimit/tierlimit/redisstore"
	"github.com/tierlimit/tierlimit/request"
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
	h := statusHarness(t, func(c *Config) { c.IP = LayerConfig{Points: 2, Duration: "60s"} })
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
		c.Global = LayerConfig{Points: 100, Duration: "60s"}
		c.IP = LayerConfig{Points: 50, Duration: "60s", Key: "header:X-Api-Key"}
		c.Routes = []RouteConfig{{Name: "login", Paths: []string{"/login"}, Key: "principal", Points: 1, Duration: "60s"}}
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
	h := statusHarness(t, func(c *Config) { c.IP = LayerConfig{Points: 2, Duration: "60s"} })
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

	for _, kind := range []int{keyOfClient, keyOfPrincipal, keyOfConst, keyOfPrincipalElseClient, keyOfHeader, keyOfHost} {
		l := &layer{Limits: limits{Name: "l", KeyKind: kind, ConstKey: "global", KeyHeader: "X-Api-Key"}, RedisEncoding: redisEncoding{RedisKey: "ratelimit:mw:l:"}}

		for _, principal := range []string{"", "alice"} {
			bucket := keyFor(l, "198.51.100.7", principal, req)
			if got, want := redisstore.ResetClusterKey(l, bucket), redisstore.ClusterKey(l, keyFor(l, "198.51.100.7", principal, req)); got != want || redisresp.Slot(got) != redisresp.Slot(want) {
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
		c.IP = LayerConfig{Points: 2, Calendar: "day"}
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

	if code, doc := h.reset("?layer=ip&key="+client, ""); code != http.StatusOK || doc.Redis == nil || *doc.Redis != redisCleared {
		t.Fatalf("reset: %d %+v", code, doc)
	}

	if redisDo(t, admin, "EXISTS", key).Int != 0 {
		t.Fatalf("the period's key %s outlived the reset", key)
	}
}
