package tierlimit

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/tierlimit/tierlimit/request"
)

// The settlement of a costFrom route's reservation when its request ends
// in any way, through the world as Traefik runs the plugin (world_test.go):
// the client reads the whole answer, hangs up mid-stream, or the handler
// panics.

// meterWorld is a proxied harness of mutate on one store, and the count of
// an API key in the route "llm".
type meterWorld struct {
	store string
	h     *harness
	count func(apiKey string) int64
}

// meterWorlds are mutate's proxied harnesses in memory and on exact Redis
// (a redis-server of the test's own).
func meterWorlds(t *testing.T, mutate func(c *Config)) []meterWorld {
	t.Helper()

	mem := behindProxy(t, newHarness(t, mutate))
	memCount := func(apiKey string) int64 {
		n, _ := mem.p.memory.Peek(mem.clock.Now().UnixNano(), "llm", request.HashKey(apiKey))
		return n
	}

	addr, admin := redisServer(t)
	rh, _ := redisHarness(t, addr, with(mutate, asACLUser))
	red := behindProxy(t, rh)
	redCount := func(apiKey string) int64 {
		v := redisDo(t, admin, "GET", red.p.stores.redis.Prefix+"llm:"+request.HashKey(apiKey))
		n, _ := strconv.ParseInt(v.Str, 10, 64)
		return n
	}

	return []meterWorld{{"memory", mem, memCount}, {"exact redis", red, redCount}}
}

// usageEvent is an event of an OpenAI-compatible stream stating tokens
// total tokens.
func usageEvent(tokens int) string {
	return fmt.Sprintf("data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}],\"usage\":{\"total_tokens\":%d}}\n\n", tokens)
}

// openKey opens a streamed completion of apiKey on h.
func openKey(h *harness, apiKey string) *openRequest {
	return h.open(http.MethodPost, "/v1/chat/completions", "203.0.113.1:1", map[string]string{"X-Api-Key": apiKey})
}

// reservedNow is what the status page shows as reserved in h's route llm.
func reservedNow(h *harness) int64 {
	for _, rt := range h.p.routes {
		if rt.layer.Name == "llm" {
			return atomic.LoadInt64(&rt.layer.Stats.Reserved)
		}
	}

	h.t.Fatal("no route llm")
	return 0
}

// The item 3: a stream states 50 then 250 total tokens, the client
// reads both and hangs up, and the proxy aborts with http.ErrAbortHandler.
// The request is settled at 250 and holds nothing any more.
func TestAClientThatHangsUpMidStreamIsChargedTheLastStatedCost(t *testing.T) {
	for _, w := range meterWorlds(t, meteredRoute("json:usage.total_tokens", 300)) {
		sb := newStepBackend("text/event-stream")
		w.h.backend = sb

		o := openKey(w.h, "k1")
		s := sb.next(t)
		s.send(usageEvent(50))
		o.readUntil("\n\n")
		s.send(usageEvent(250))
		o.readUntil("\n\n")
		o.hangUp()
		o.wait()
		<-s.gone

		if n := w.count("k1"); n != 250 {
			t.Errorf("%s: k1 counts %d after the client hung up, want the 250 the stream stated", w.store, n)
		}

		if n := reservedNow(w.h); n != 0 {
			t.Errorf("%s: reserved %d after the request ended, want 0", w.store, n)
		}
	}
}

// A stream that stated nothing before its client hung up is charged its
// reservation and counted unreported, with the event docs/limits.md
// promises for a cut stream.
func TestACutStreamThatStatedNothingIsUnreported(t *testing.T) {
	for _, w := range meterWorlds(t, meteredRoute("json:usage.total_tokens", 300)) {
		sb := newStepBackend("text/event-stream")
		w.h.backend = sb

		o := openKey(w.h, "k1")
		s := sb.next(t)
		s.send("data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}],\"usage\":null}\n\n")
		o.readUntil("\n\n")
		o.hangUp()
		o.wait()
		<-s.gone

		if n := w.count("k1"); n != 300 {
			t.Errorf("%s: k1 counts %d, want the reservation of 300", w.store, n)
		}

		l := w.h.p.routes[0].layer
		if n := atomic.LoadInt64(&l.Stats.Unreported); n != 1 {
			t.Errorf("%s: unreported %d, want 1", w.store, n)
		}

		if n := strings.Count(w.h.events.String(), "RATE_LIMIT_COST_UNREPORTED"); n != 1 {
			t.Errorf("%s: %d RATE_LIMIT_COST_UNREPORTED events, want 1:\n%s", w.store, n, w.h.events.String())
		}
	}
}

// A handler after the plugin that panics mid-stream (another middleware, a
// bug): the request is settled at what it stated, frees its reservation,
// and the panic goes on to Traefik, which answers or drops the connection.
func TestAPanicMidStreamSettlesAndGoesOn(t *testing.T) {
	for _, w := range meterWorlds(t, meteredRoute("json:usage.total_tokens", 300)) {
		var seen atomic.Value

		w.h.backend = http.HandlerFunc(func(rw http.ResponseWriter, req *http.Request) {
			// Flushed: chunked, no Content-Length, as streams are.
			rw.Header().Set("Content-Type", "text/event-stream")
			_, _ = rw.Write([]byte(usageEvent(70)))
			rw.(http.Flusher).Flush()
		})

		proxy := w.h.p.next
		w.h.p.next = http.HandlerFunc(func(rw http.ResponseWriter, req *http.Request) {
			proxy.ServeHTTP(rw, req)
			panic("a bug after the proxy")
		})

		f := w.h.front
		f.mu.Lock()
		inner := f.serving
		f.serving = http.HandlerFunc(func(rw http.ResponseWriter, req *http.Request) {
			defer func() {
				v := recover()
				seen.Store(fmt.Sprint(v))
				if v != nil {
					panic(v)
				}
			}()
			inner.ServeHTTP(rw, req)
		})
		f.mu.Unlock()

		o := openKey(w.h, "k1")
		o.wait()

		if v, _ := seen.Load().(string); v != "a bug after the proxy" {
			t.Errorf("%s: the front saw %q, want the handler's panic", w.store, v)
		}

		if n := w.count("k1"); n != 70 {
			t.Errorf("%s: k1 counts %d, want the 70 stated", w.store, n)
		}

		if n := reservedNow(w.h); n != 0 {
			t.Errorf("%s: reserved %d after the request ended, want 0", w.store, n)
		}
	}
}

// The item 4: streams that state their cumulative usage in every
// event (vLLM's continuous_usage_stats) hold their reserve until they end:
// with 1000 points and a reserve of 400, two streams that stated 10 so far
// leave no room for a third request, and the key ends at what they stated
// last, never past its points.
func TestAStreamStatingUsageInEveryEventHoldsItsReserve(t *testing.T) {
	for _, w := range meterWorlds(t, meteredRoute("json:usage.total_tokens", 400)) {
		sb := newStepBackend("text/event-stream")
		w.h.backend = http.HandlerFunc(func(rw http.ResponseWriter, req *http.Request) {
			if req.Header.Get("X-Stream") != "" {
				sb.ServeHTTP(rw, req)
				return
			}

			jsonUsage(400).ServeHTTP(rw, req)
		})

		var opened []*openRequest
		var streams []*steps

		for i := 0; i < 2; i++ {
			o := w.h.open(http.MethodPost, "/v1/chat/completions", "203.0.113.1:1", map[string]string{"X-Api-Key": "k1", "X-Stream": "1"})
			s := sb.next(t)
			s.send(usageEvent(10))
			o.readUntil("\n\n")
			opened = append(opened, o)
			streams = append(streams, s)
		}

		if rec := w.h.key("k1"); rec.Code != http.StatusTooManyRequests {
			t.Errorf("%s: a third request while two streams hold 400 each: %d, want 429", w.store, rec.Code)
		}

		for i, s := range streams {
			s.send(usageEvent(400))
			s.end()
			opened[i].readAll()
			opened[i].wait()
		}

		if n := w.count("k1"); n > 1000 || n != 800 {
			t.Errorf("%s: k1 counts %d, want the 800 the two streams stated", w.store, n)
		}
	}
}

// The item 9: a costFrom route in dry run beside a layer that
// enforces (so the route is quiet: never in the headers) gives back what a
// response reports below its reservation, as an enforcing route does.
func TestAQuietDryRunCostFromRouteGivesTheRestBack(t *testing.T) {
	mutate := with(meteredRoute("header:X-Usage", 300), func(c *Config) {
		c.Routes[0].DryRun = true
		c.IP = LayerConfig{Points: 100, Duration: "60s"}
	})

	for _, w := range meterWorlds(t, mutate) {
		w.h.backend = http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) {
			rw.Header().Set("X-Usage", "10")
			_, _ = rw.Write([]byte("ok"))
		})

		for i := 0; i < 5; i++ {
			if rec := w.h.key("k1"); rec.Code != http.StatusOK {
				t.Fatalf("%s: request %d: %d", w.store, i+1, rec.Code)
			}
		}

		if n := w.count("k1"); n != 50 {
			t.Errorf("%s: k1 counts %d, want the 50 reported", w.store, n)
		}

		if strings.Contains(w.h.events.String(), "RATE_LIMIT_TRIGGERED") {
			t.Errorf("%s: a refusal was logged for 50 of 1000 points:\n%s", w.store, w.h.events.String())
		}
	}
}

// The item 10: in the recommended chain, an event about a costFrom
// layer names the middleware that owns the layer, not the edge before it,
// and the settlement goes to that middleware's counters.
func TestCostEventsNameTheMiddlewareOfTheLayer(t *testing.T) {
	h := behindProxy(t, newHarness(t, meteredRoute("json:usage.total_tokens", 300)))
	h.backend = http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) {
		_, _ = rw.Write([]byte("no usage here"))
	})

	edgeName := "edge-" + h.p.name
	chainedBefore(t, h, func(c *Config) {
		c.Global.Points = 0
		c.IP = LayerConfig{Points: 600, Duration: "60s"}
		c.Principal.CredentialHeaders = []string{"Authorization"}
	}, edgeName)

	rec := h.do(http.MethodPost, "/v1/chat/completions", "203.0.113.1:1", map[string]string{"X-Api-Key": "k1", "Authorization": "Bearer t"})
	if rec.Code != http.StatusOK {
		t.Fatalf("request: %d", rec.Code)
	}

	var line string
	for _, l := range strings.Split(h.events.String(), "\n") {
		if strings.Contains(l, "RATE_LIMIT_COST_UNREPORTED") {
			line = l
		}
	}

	if !strings.Contains(line, `"middleware":"`+h.p.name+`"`) {
		t.Errorf("the event names another middleware than %s, the layer's: %q", h.p.name, line)
	}

	if n := atomic.LoadInt64(&h.p.routes[0].layer.Stats.Unreported); n != 1 {
		t.Errorf("unreported %d, want 1", n)
	}
}

// A stream that states a huge cost (past what a slow token bucket's clock
// can hold, which the spend saturates) and then a small one gives the
// difference back without overflowing: the key is not blocked for
// centuries.
func TestAHugeStatedCostOnASlowBucketGivesBackWithoutOverflow(t *testing.T) {
	h := behindProxy(t, newHarness(t, with(meteredRoute("json:usage.total_tokens", 0), func(c *Config) {
		c.Routes[0].Points = 10
		c.Routes[0].Duration = "30m"
		c.Routes[0].Algorithm = "tokenbucket"
	})))
	sb := newStepBackend("text/event-stream")
	h.backend = sb

	o := openKey(h, "k1")
	s := sb.next(t)
	s.send(usageEvent(100000000000000000))
	o.readUntil("\n\n")
	s.send(usageEvent(5))
	o.readUntil("\n\n")
	s.end()
	o.readAll()
	o.wait()

	h.backend = jsonUsage(1)

	if rec := h.key("k1"); rec.Code != http.StatusOK {
		t.Errorf("a request after the stream settled at 5 of a burst of 10: %d (retry after %s s), want 200",
			rec.Code, rec.Header().Get("Retry-After"))
	}
}

// Several copies of the cost header, or one header listing several values
// ("4, 5", which HTTP reads as the same list), state the largest: a
// backend cannot state less by repeating the header, and a proxy that
// folds copies into one line changes nothing.
func TestSeveralCostHeaderValuesStateTheLargest(t *testing.T) {
	for _, tc := range []struct {
		name   string
		values []string
		want   int64
	}{
		{"two copies", []string{"4", "5"}, 5},
		{"the larger first", []string{"5", "4"}, 5},
		{"one folded line", []string{"4, 5"}, 5},
		{"an empty member", []string{"4,, 5 ,"}, 5},
		{"one bad member", []string{"4", "five"}, 300},
	} {
		h := behindProxy(t, newHarness(t, meteredRoute("header:X-Usage", 300)))
		h.backend = http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) {
			rw.Header()["X-Usage"] = tc.values
			_, _ = rw.Write([]byte("ok"))
		})

		h.key("k1")

		if n, _ := h.p.memory.Peek(h.clock.Now().UnixNano(), "llm", request.HashKey("k1")); n != tc.want {
			t.Errorf("%s %q: k1 counts %d, want %d", tc.name, tc.values, n, tc.want)
		}
	}
}

// The settlement of a costFrom route goes to the counters of the
// middleware that owns it, whatever store the middleware before it in the
// chain uses: an edge on exact Redis before a principal instance counting
// in memory (the item 2 saw the settlement land in the edge's
// store).
func TestTheSettlementGoesToTheStoreOfTheLayersMiddleware(t *testing.T) {
	h := behindProxy(t, newHarness(t, meteredRoute("header:X-Usage", 100)))
	h.backend = http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) {
		rw.Header().Set("X-Usage", "500")
		_, _ = rw.Write([]byte("ok"))
	})

	addr, admin := redisServer(t)
	chainedBefore(t, h, func(c *Config) {
		c.Store = "redis"
		c.Redis.Address = addr
		c.Global.Points = 0
		c.IP = LayerConfig{Points: 600, Duration: "60s"}
		c.Principal.CredentialHeaders = []string{"Authorization"}
	}, "edge-"+h.p.name)

	h.do(http.MethodPost, "/v1/chat/completions", "203.0.113.1:1", map[string]string{"X-Api-Key": "k1", "Authorization": "Bearer t"})

	if n, _ := h.p.memory.Peek(h.clock.Now().UnixNano(), "llm", request.HashKey("k1")); n != 500 {
		t.Errorf("the layer's middleware counts %d for k1, want the 500 reported", n)
	}

	// The edge charges a credentialed request nothing up front (global off).
	if keys := redisDo(t, admin, "KEYS", "*").Array; len(keys) != 0 {
		t.Errorf("the edge's Redis holds %v: the settlement went to the edge's store", keys)
	}
}
