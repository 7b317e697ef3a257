package tierlimit

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/tierlimit/tierlimit/redisresp"
)

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
		c.Global = LayerConfig{Points: 1000, Duration: "1h"}
		c.IP = LayerConfig{Points: 1000, Duration: "1h"}
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

// TestOddFixedKeysStartAfreshOnRedisServer: a fixed layer's key that holds
// no live counter (of another kind, not an integer, negative, without a TTL,
// or living longer than the window) is read as empty and restarted by an
// allowed request, with the window's TTL; a request another layer refuses
// leaves each of them, and every live counter it reads, as it was.
func TestOddFixedKeysStartAfreshOnRedisServer(t *testing.T) {
	addr, admin := redisServer(t)

	h, _ := redisHarness(t, addr, func(c *Config) {
		asACLUser(c)
		c.Global = LayerConfig{Points: 1000, Duration: "1h"}
		c.IP = LayerConfig{Points: 2, Duration: "1h"}
	})
	s := h.p.stores.redis
	layers := h.p.planIP
	global := layers[0].RedisConstKey
	global = global[strings.Index(global, "\r\n")+2 : len(global)-2]

	odd := map[string][]string{
		"hash":     {"HSET", global, "c", "5"},
		"text":     {"SET", global, "five", "PX", "60000"},
		"negative": {"SET", global, "-3", "PX", "60000"},
		"no ttl":   {"SET", global, "7"},
		"stale":    {"SET", global, "7", "PX", "86400000"},
	}

	fresh := 100

	for name, setup := range odd {
		fresh++

		redisDo(t, admin, "DEL", global)
		redisDo(t, admin, setup...)

		// The ip key is spent by two requests of another client first: the
		// third is refused by ip, after global was read (and charged, then
		// given back, when it held a live counter).
		client := "203.0.113.50"
		redisDo(t, admin, "SET", layers[1].RedisKey+client, "2", "PX", "60000")

		before := serverState(t, admin)
		if tl := scriptCharge(t, s, layers, client, 1); !tl.Refused || tl.Shown != 1 {
			t.Fatalf("%s: %+v, want refused by ip", name, tl)
		}

		if after := serverState(t, admin); after != before {
			t.Fatalf("%s: the refused request changed Redis:\n%s\nto\n%s", name, before, after)
		}

		if tl := scriptCharge(t, s, layers, "203.0.113."+strconv.Itoa(fresh), 1); tl.Refused || tl.Count != 1 {
			t.Fatalf("%s: %+v, want allowed with a fresh global and ip", name, tl)
		}

		if v := redisDo(t, admin, "GET", global).Str; v != "1" {
			t.Fatalf("%s: global holds %q, want a fresh 1", name, v)
		}

		if ttl := redisDo(t, admin, "PTTL", global).Int; ttl <= 0 || ttl > 3600000 {
			t.Fatalf("%s: global's PTTL %d, want the window's", name, ttl)
		}
	}

	// A live counter a refusal read is given back byte for byte.
	redisDo(t, admin, "SET", global, "41", "PX", "60000")

	before := serverState(t, admin)
	if tl := scriptCharge(t, s, layers, "203.0.113.50", 1); !tl.Refused {
		t.Fatalf("%+v, want refused by ip", tl)
	}

	if after := serverState(t, admin); after != before {
		t.Fatalf("the refused request changed Redis:\n%s\nto\n%s", before, after)
	}
}
