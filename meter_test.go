package tierlimit

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/request"
)

// meteredRoute is the route: 1000 points a minute per API key,
// charged what the response reports at source, each request holding
// reserve points while in flight (0: the default, 1).
func meteredRoute(source string, reserve int) func(c *Config) {
	return func(c *Config) {
		c.Global.Points = 0
		c.IP.Points = 0
		c.Routes = []RouteConfig{{
			Name: "llm", Paths: []string{"/v1/"}, Key: "header:X-Api-Key", Points: 1000, Duration: "60s",
			CostFrom: source, Reserve: reserve,
		}}
	}
}

// jsonUsage answers a JSON body stating tokens total tokens.
func jsonUsage(tokens int) http.Handler {
	return http.HandlerFunc(func(rw http.ResponseWriter, req *http.Request) {
		rw.Header().Set("Content-Type", "application/json")
		_, _ = fmt.Fprintf(rw, `{"id":"x","usage":{"prompt_tokens":1,"total_tokens":%d}}`, tokens)
	})
}

// streamUsage answers an OpenAI-style event stream whose final usage chunk
// states tokens, then [DONE].
func streamUsage(tokens int) http.Handler {
	return http.HandlerFunc(func(rw http.ResponseWriter, req *http.Request) {
		rw.Header().Set("Content-Type", "text/event-stream")
		_, _ = rw.Write([]byte("data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}],\"usage\":null}\n\n"))
		rw.(http.Flusher).Flush()
		_, _ = fmt.Fprintf(rw, "data: {\"choices\":[],\"usage\":{\"total_tokens\":%d}}\n\n", tokens)
		_, _ = rw.Write([]byte("data: [DONE]\n\n"))
	})
}

func (h *harness) key(apiKey string) *httptest.ResponseRecorder {
	return h.do(http.MethodPost, "/v1/chat/completions", "203.0.113.1:1", map[string]string{"X-Api-Key": apiKey})
}

// spendsAsReported: with 400 tokens a response, three requests of a key
// are allowed, the fourth refused; another key is allowed.
func spendsAsReported(t *testing.T, name string, h *harness) {
	t.Helper()

	for i, want := range []int{200, 200, 200, 429} {
		if rec := h.key("k1"); rec.Code != want {
			t.Fatalf("%s: request %d of k1: %d, want %d", name, i+1, rec.Code, want)
		}
	}

	if rec := h.key("k2"); rec.Code != http.StatusOK {
		t.Fatalf("%s: k2 after k1 ran out: %d, want 200", name, rec.Code)
	}
}

func TestCostFromChargesWhatTheResponseReports(t *testing.T) {
	for _, tc := range []struct {
		name, source string
		backend      http.Handler
	}{
		{"json body", "json:usage.total_tokens", jsonUsage(400)},
		{"event stream", "json:usage.total_tokens", streamUsage(400)},
		{"header", "header:X-Usage", http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) {
			rw.Header().Set("X-Usage", "400")
			_, _ = rw.Write([]byte("ok"))
		})},
		{"trailer", "header:X-Usage", http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) {
			rw.Header().Set("Trailer", "X-Usage")
			_, _ = rw.Write([]byte("ok"))
			rw.Header().Set("X-Usage", "400")
		})},
		{"undeclared trailer", "header:X-Usage", http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) {
			_, _ = rw.Write([]byte("ok"))
			rw.Header().Set(http.TrailerPrefix+"X-Usage", "400")
		})},
	} {
		h := newHarness(t, meteredRoute(tc.source, 0))
		h.backend = tc.backend
		spendsAsReported(t, tc.name, h)

		if n, _ := h.p.memory.Peek(h.clock.Now().UnixNano(), "llm", request.HashKey("k1")); n != 1200 {
			t.Errorf("%s: k1 counts %d, want the 1200 reported", tc.name, n)
		}
	}
}

// The RateLimit headers are those of the admission: the reservation.
func TestCostFromHeadersShowTheAdmission(t *testing.T) {
	h := newHarness(t, meteredRoute("json:usage.total_tokens", 300))
	h.backend = jsonUsage(100)

	rec := h.key("k1")
	if got := rec.Header().Get("X-Ratelimit-Remaining"); got != "700" {
		t.Errorf("first request: remaining %q, want 700 (1000 - the reserve of 300)", got)
	}

	rec = h.key("k1")
	if got := rec.Header().Get("X-Ratelimit-Remaining"); got != "600" {
		t.Errorf("second request: remaining %q, want 600 (the first settled at 100, this one holds 300)", got)
	}
}

// Ten simultaneous requests holding 300 each of 1000: exactly three are
// admitted; once they report 100 each, the layer holds 300.
func TestReserveBoundsRequestsInFlight(t *testing.T) {
	h := newHarness(t, meteredRoute("header:X-Usage", 300))

	entered := make(chan struct{}, 10)
	release := make(chan struct{})
	h.backend = http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) {
		entered <- struct{}{}
		<-release
		rw.Header().Set("X-Usage", "100")
	})

	codes := make(chan int, 10)
	var wg sync.WaitGroup

	for i := 0; i < 10; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			codes <- h.key("k1").Code
		}()
	}

	// The refused answer at once; the admitted wait in the backend.
	allowed, refused := 0, 0
	for allowed+refused < 10 {
		select {
		case <-entered:
			allowed++
		case code := <-codes:
			if code != http.StatusTooManyRequests {
				t.Fatalf("a request answered %d before any was released", code)
			}
			refused++
		}
	}

	close(release)
	wg.Wait()
	close(codes)

	for code := range codes {
		if code != http.StatusOK {
			t.Errorf("an admitted request answered %d", code)
		}
	}

	if allowed != 3 || refused != 7 {
		t.Errorf("%d admitted and %d refused, want 3 and 7", allowed, refused)
	}

	if n, _ := h.p.memory.Peek(h.clock.Now().UnixNano(), "llm", request.HashKey("k1")); n != 300 {
		t.Errorf("k1 counts %d once settled, want 3 x 100", n)
	}
}

// A cost past the points takes the layer into debt: refused until the
// window has room again, which for a fixed window is the next one.
func TestCostPastThePointsRefusesUntilTheNextWindow(t *testing.T) {
	h := newHarness(t, meteredRoute("json:usage.total_tokens", 0))
	h.backend = jsonUsage(2500)

	if rec := h.key("k1"); rec.Code != http.StatusOK {
		t.Fatalf("first request: %d", rec.Code)
	}

	rec := h.key("k1")
	if rec.Code != http.StatusTooManyRequests || rec.Header().Get("Retry-After") == "" {
		t.Fatalf("after 2500 of 1000: %d, Retry-After %q; want 429 with it", rec.Code, rec.Header().Get("Retry-After"))
	}

	h.clock.Add(60 * time.Second)

	if rec := h.key("k1"); rec.Code != http.StatusOK {
		t.Errorf("in the next window: %d, want 200", rec.Code)
	}
}

// A token bucket repays a debt as it refills: 2500 tokens of a bucket of
// 1000 a minute leave it refusing for 1.5 minutes more.
func TestCostPastABucketsBurstIsRepaidAsItRefills(t *testing.T) {
	h := newHarness(t, func(c *Config) {
		meteredRoute("json:usage.total_tokens", 0)(c)
		c.Routes[0].Algorithm = "tokenbucket"
	})
	h.backend = jsonUsage(2500)

	if rec := h.key("k1"); rec.Code != http.StatusOK {
		t.Fatalf("first request: %d", rec.Code)
	}

	h.clock.Add(89 * time.Second)

	if rec := h.key("k1"); rec.Code != http.StatusTooManyRequests {
		t.Fatalf("89 s after a debt of 1500: %d, want 429", rec.Code)
	}

	h.clock.Add(2 * time.Second)

	if rec := h.key("k1"); rec.Code != http.StatusOK {
		t.Errorf("91 s after: %d, want 200", rec.Code)
	}

	// A response that ends minutes after its admission, when the bucket
	// is full again: its debt runs from the end, not from the admission.
	h.clock.Add(10 * time.Minute)
	h.backend = http.HandlerFunc(func(rw http.ResponseWriter, req *http.Request) {
		h.clock.Add(2 * time.Minute)
		jsonUsage(2500).ServeHTTP(rw, req)
	})
	h.key("k1")

	if rec := h.key("k1"); rec.Code != http.StatusTooManyRequests {
		t.Errorf("right after a slow response of 2500: %d, want 429", rec.Code)
	}
}

// A response that states no cost leaves its reservation charged, and one
// event per layer and window says so.
func TestMissingCostKeepsTheReservation(t *testing.T) {
	h := newHarness(t, meteredRoute("json:usage.total_tokens", 300))
	h.backend = http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) {
		rw.WriteHeader(http.StatusBadGateway)
		_, _ = rw.Write([]byte("upstream down"))
	})

	for i := 0; i < 2; i++ {
		h.key("k1")
	}

	if n, _ := h.p.memory.Peek(h.clock.Now().UnixNano(), "llm", request.HashKey("k1")); n != 600 {
		t.Errorf("k1 counts %d, want the two reservations, 600", n)
	}

	if got := strings.Count(h.events.String(), "RATE_LIMIT_COST_UNREPORTED"); got != 1 {
		t.Errorf("%d events in the window, want 1: %s", got, h.events.String())
	}

	if !strings.Contains(h.events.String(), `"costFrom":"json:usage.total_tokens"`) {
		t.Errorf("the event does not name the source: %s", h.events.String())
	}

	h.clock.Add(60 * time.Second)
	h.key("k1")

	if got := strings.Count(h.events.String(), "RATE_LIMIT_COST_UNREPORTED"); got != 2 {
		t.Errorf("%d events after the next window's, want 2", got)
	}

	if st := h.p.routes[0].layer.Stats; st.Unreported != 3 || st.Reserved != 0 {
		t.Errorf("stats: %d unreported, %d reserved; want 3 and 0", st.Unreported, st.Reserved)
	}
}

// A cost below the reservation gives the rest back, in the window of the
// admission only: a response that ends in the next window gives that
// window nothing.
func TestCostBelowTheReserveGivesTheRestBack(t *testing.T) {
	h := newHarness(t, meteredRoute("header:X-Usage", 300))

	var advance time.Duration
	h.backend = http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) {
		h.clock.Add(advance)
		rw.Header().Set("X-Usage", "20")
	})

	h.key("k1")

	if n, _ := h.p.memory.Peek(h.clock.Now().UnixNano(), "llm", request.HashKey("k1")); n != 20 {
		t.Fatalf("k1 counts %d, want the 20 reported", n)
	}

	// Admitted 1 s before the window's end, answered 1 s after it.
	h.clock.Add(58 * time.Second)
	advance = 2 * time.Second
	h.key("k1")

	if n, _ := h.p.memory.Peek(h.clock.Now().UnixNano(), "llm", request.HashKey("k1")); n != 0 {
		t.Errorf("the next window counts %d, want 0: the reservation ended with its window", n)
	}
}

// A client that goes away mid-stream is charged what the stream reported
// before it went, else the reservation.
func TestDisconnectMidStreamChargesWhatWasReported(t *testing.T) {
	for _, tc := range []struct {
		name   string
		events string
		want   int64
	}{
		{"after a usage event", "data: {\"usage\":{\"total_tokens\":50}}\n\ndata: {\"choices\":[", 50},
		{"before any", "data: {\"choices\":[{\"delta\":{}}]}\n\ndata: {\"cho", 300},
	} {
		h := newHarness(t, meteredRoute("json:usage.total_tokens", 300))
		h.backend = http.HandlerFunc(func(rw http.ResponseWriter, req *http.Request) {
			rw.Header().Set("Content-Type", "text/event-stream")
			_, _ = rw.Write([]byte(tc.events))
			// The client went away: the proxy returns with the stream cut.
		})

		h.key("k1")

		if n, _ := h.p.memory.Peek(h.clock.Now().UnixNano(), "llm", request.HashKey("k1")); n != tc.want {
			t.Errorf("%s: k1 counts %d, want %d", tc.name, n, tc.want)
		}
	}
}

// A request refused by another layer reserves nothing, and one refused for
// its reservation spends nothing elsewhere.
func TestReservationIsAllOrNothing(t *testing.T) {
	h := newHarness(t, func(c *Config) {
		meteredRoute("header:X-Usage", 600)(c)
		c.Global = LayerConfig{Points: 3, Duration: "60s"}
	})
	h.backend = http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) {
		rw.Header().Set("X-Usage", "600")
	})

	now := func() int64 { return h.clock.Now().UnixNano() }

	h.key("k1") // global 1, llm 600
	if rec := h.key("k1"); rec.Code != http.StatusTooManyRequests {
		t.Fatalf("a second reserve of 600: %d, want 429", rec.Code)
	}

	if n, _ := h.p.memory.Peek(now(), "global", "global"); n != 1 {
		t.Errorf("global counts %d after the refusal by llm, want 1", n)
	}

	h.key("k2") // global 2
	h.key("k3") // global 3

	if rec := h.key("k4"); rec.Code != http.StatusTooManyRequests {
		t.Fatalf("k4 past global: %d", rec.Code)
	}

	if n, _ := h.p.memory.Peek(now(), "llm", request.HashKey("k4")); n != 0 {
		t.Errorf("k4 holds %d in llm after global refused it, want 0", n)
	}
}

func TestCostFromConfiguration(t *testing.T) {
	route := func(mutate func(r *RouteConfig)) func(c *Config) {
		return func(c *Config) {
			r := RouteConfig{Name: "llm", Paths: []string{"/v1/"}, Points: 1000, Duration: "60s", CostFrom: "json:usage.total_tokens"}
			mutate(&r)
			c.Routes = []RouteConfig{r}
		}
	}

	for _, tc := range []struct {
		name   string
		mutate func(c *Config)
		want   string // "" when valid
	}{
		{"json", route(func(r *RouteConfig) {}), ""},
		{"header and reserve", route(func(r *RouteConfig) { r.CostFrom, r.Reserve = "header:X-Usage", 1000 }), ""},
		{"bad source", route(func(r *RouteConfig) { r.CostFrom = "body:usage" }), `routes[0].costFrom = "body:usage": unknown source: must start with "llm:", "json:" or "header:"`},
		{"a misspelt term of a sum", route(func(r *RouteConfig) { r.CostFrom = "llm:input + 4*llm:inptu" }), `routes[0].costFrom = "llm:input + 4*llm:inptu": the term "4*llm:inptu": unknown source`},
		{"a weight with four decimals", route(func(r *RouteConfig) { r.CostFrom = "0.1255*llm:output" }), `routes[0].costFrom = "0.1255*llm:output": the weight "0.1255"`},
		{"a sum", route(func(r *RouteConfig) { r.CostFrom = "llm:input + 0.5*llm:cachedInput + 4*json:usage.x + header:X-Extra" }), ""},
		{"bad header", route(func(r *RouteConfig) { r.CostFrom = "header:X Usage" }), `routes[0].costFrom = "header:X Usage"`},
		{"reserve past the points", route(func(r *RouteConfig) { r.Reserve = 1001 }), `routes[0].reserve = "1001"`},
		{"reserve past a burst", route(func(r *RouteConfig) { r.Algorithm, r.Burst, r.Reserve = "tokenbucket", 100, 101 }), `routes[0].reserve = "101"`},
		{"negative reserve", route(func(r *RouteConfig) { r.Reserve = -1 }), `routes[0].reserve = "-1"`},
		{"reserve without costFrom", route(func(r *RouteConfig) { r.CostFrom, r.Reserve = "", 5 }), `routes[0].reserve = "5": takes costFrom`},
		{"with countStatus", route(func(r *RouteConfig) { r.CountStatus = []int{401} }), `routes[0].costFrom = "json:usage.total_tokens": cannot be combined with countStatus`},
		{"on a route that is off", route(func(r *RouteConfig) { r.Points = 0 }), `routes[0].costFrom`},
		{"cost past the points charges the other layers", route(func(r *RouteConfig) { r.Points, r.Cost = 10, 20 }), ""},
		{"on a concurrency route", route(func(r *RouteConfig) { r.Algorithm = "concurrency" }), `routes[0].costFrom = "json:usage.total_tokens": charges points when the response ends`},
		{"on a route plan of concurrency", func(c *Config) {
			route(func(r *RouteConfig) {
				r.Plans = map[string]PlanConfig{"pro": {Points: 5, Duration: "60s", Algorithm: "concurrency"}}
			})(c)
			c.Principal.UserHeader, c.Principal.PlanHeader = "X-Auth-User", "X-Auth-Plan"
			c.Plans = map[string]PlanConfig{"pro": {Points: 5, Duration: "60s"}}
		}, `routes[0].costFrom`},
	} {
		cfg := CreateConfig()
		tc.mutate(cfg)

		_, err := parse(cfg)

		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: error %v, want one naming %q", tc.name, err, tc.want)
		}
	}
}

// The status page and the metrics show a costFrom route's reservations in
// flight, the points settled and the responses that reported none.
func TestStatusShowsReservationsAndSettlements(t *testing.T) {
	h := newHarness(t, func(c *Config) {
		meteredRoute("header:X-Usage", 300)(c)
		c.Status.Path = "/_rl"
	})

	entered, release := make(chan struct{}), make(chan struct{})
	h.backend = http.HandlerFunc(func(rw http.ResponseWriter, req *http.Request) {
		if req.Header.Get("X-Api-Key") == "slow" {
			entered <- struct{}{}
			<-release
		}

		if req.Header.Get("X-Api-Key") != "silent" {
			rw.Header().Set("X-Usage", "40")
		}
	})

	h.key("k1")
	h.key("silent")

	done := make(chan struct{})
	go func() {
		defer close(done)
		h.key("slow")
	}()
	<-entered

	var llm *statusLayer
	doc := h.p.statusLayers(make([]int, len(h.p.layers)))
	for i := range doc {
		if doc[i].Name == "llm" {
			llm = &doc[i]
		}
	}

	want := statusMeter{Source: "header:X-Usage", Reserve: 300, Reserved: 1, Settled: 40, Unreported: 1}
	if llm == nil || llm.CostFrom == nil || *llm.CostFrom != want {
		t.Errorf("status of llm: %+v, want costFrom %+v", llm, want)
	}

	metrics := h.get("/_rl/metrics", local).Body.String()
	for _, line := range []string{
		`tierlimit_reserved_requests{middleware="` + h.p.name + `",layer="llm"} 1`,
		`tierlimit_settled_points_total{middleware="` + h.p.name + `",layer="llm"} 40`,
		`tierlimit_unreported_total{middleware="` + h.p.name + `",layer="llm"} 1`,
	} {
		if !strings.Contains(metrics, line+"\n") {
			t.Errorf("metrics lack %q:\n%s", line, metrics)
		}
	}

	close(release)
	<-done

	if got := h.p.routes[0].layer.Stats.Reserved; got != 0 {
		t.Errorf("reserved %d once the response ended, want 0", got)
	}
}

// A response the plugin replaces by a 429 (the edge's ip bucket refusing
// a garbage credential once the auth answered 401) costs nothing: its
// reservation goes back, whatever the replaced response reported.
func TestReplacedResponseCostsNothing(t *testing.T) {
	h := newHarness(t, func(c *Config) {
		meteredRoute("header:X-Usage", 0)(c)
		c.IP = LayerConfig{Points: 1, Duration: "60s"}
		c.Principal.CredentialHeaders = []string{"Authorization"}
	})
	h.backend = http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) {
		rw.Header().Set("X-Usage", "500")
		rw.WriteHeader(http.StatusUnauthorized)
	})

	garbage := map[string]string{"X-Api-Key": "k1", "Authorization": "Bearer garbage"}
	for i, want := range []int{401, 429} {
		if rec := h.do(http.MethodPost, "/v1/chat/completions", "203.0.113.1:1", garbage); rec.Code != want {
			t.Fatalf("garbage credential %d: %d, want %d", i+1, rec.Code, want)
		}
	}

	if n, _ := h.p.memory.Peek(h.clock.Now().UnixNano(), "llm", request.HashKey("k1")); n != 500 {
		t.Errorf("llm counts %d for k1, want 500: the first response's, none for the one replaced by a 429", n)
	}
}

// A route's cost still charges the other layers; a route plan's layer
// settles as the route's does.
func TestCostFromWithACostAndPlans(t *testing.T) {
	h := newHarness(t, func(c *Config) {
		meteredRoute("header:X-Usage", 0)(c)
		c.Global = LayerConfig{Points: 100, Duration: "60s"}
		c.Principal.UserHeader = "X-Auth-User"
		c.Principal.PlanHeader = "X-Auth-Plan"
		c.Plans = map[string]PlanConfig{"pro": {Points: 1000, Duration: "60s"}}
		c.Routes[0].Key = "principal"
		c.Routes[0].Cost = 5
		c.Routes[0].Plans = map[string]PlanConfig{"pro": {Points: 5000, Duration: "60s"}}
	})
	h.backend = http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) {
		rw.Header().Set("X-Usage", "2000")
	})

	now := func() int64 { return h.clock.Now().UnixNano() }
	ann := map[string]string{"X-Auth-User": "ann"}
	pro := map[string]string{"X-Auth-User": "bob", "X-Auth-Plan": "pro"}

	if rec := h.do(http.MethodPost, "/v1/x", "203.0.113.1:1", ann); rec.Code != http.StatusOK {
		t.Fatalf("ann: %d", rec.Code)
	}

	if rec := h.do(http.MethodPost, "/v1/x", "203.0.113.1:1", ann); rec.Code != http.StatusTooManyRequests {
		t.Errorf("ann after 2000 of 1000: %d, want 429", rec.Code)
	}

	for i, want := range []int{200, 200, 200, 429} {
		if rec := h.do(http.MethodPost, "/v1/x", "203.0.113.1:1", pro); rec.Code != want {
			t.Fatalf("bob (pro) request %d: %d, want %d", i+1, rec.Code, want)
		}
	}

	if n, _ := h.p.memory.Peek(now(), "llm.pro", "bob"); n != 6000 {
		t.Errorf("llm.pro counts %d for bob, want 3 x 2000", n)
	}

	if n, _ := h.p.memory.Peek(now(), "global", "global"); n != 20 {
		t.Errorf("global counts %d, want 4 requests admitted x the route's cost of 5", n)
	}
}

// watchCount is a ResponseWriter that records, at each write, what the
// layer counts for a key: what a client would find when it got those bytes.
type watchCount struct {
	*httptest.ResponseRecorder
	count func() int64
	seen  []int64
}

func (w *watchCount) Write(b []byte) (int, error) {
	w.seen = append(w.seen, w.count())
	return w.ResponseRecorder.Write(b)
}

// A body of known length is settled before its last bytes leave, so that a
// client that has read it all, and sends its next request, finds the cost
// charged.
func TestSettledBeforeTheLastBytesOfTheBody(t *testing.T) {
	h := newHarness(t, meteredRoute("json:usage.total_tokens", 0))
	body := `{"usage":{"total_tokens":400}}`
	h.backend = http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) {
		rw.Header().Set("Content-Type", "application/json")
		rw.Header().Set("Content-Length", strconv.Itoa(len(body)))
		_, _ = rw.Write([]byte(body[:10]))
		_, _ = rw.Write([]byte(body[10:]))
	})

	w := &watchCount{ResponseRecorder: httptest.NewRecorder(), count: func() int64 {
		n, _ := h.p.memory.Peek(h.clock.Now().UnixNano(), "llm", request.HashKey("k1"))
		return n
	}}

	req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil)
	req.Header.Set("X-Api-Key", "k1")
	h.h.ServeHTTP(w, req)

	if len(w.seen) != 2 || w.seen[0] != 1 || w.seen[1] != 400 {
		t.Errorf("counts at the two writes: %v, want [1 400]: the reservation, then the cost before the last bytes", w.seen)
	}
}

// A reload while a request is in flight loses nothing: its settlement
// reaches the counters that the new instance reads.
func TestSettlementAcrossAReload(t *testing.T) {
	conf := meteredRoute("header:X-Usage", 300)
	h := newHarness(t, conf)

	entered, release := make(chan struct{}), make(chan struct{})
	h.backend = http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) {
		entered <- struct{}{}
		<-release
		rw.Header().Set("X-Usage", "700")
	})

	done := make(chan struct{})
	go func() {
		defer close(done)
		h.key("k1")
	}()
	<-entered

	r := reloaded(t, h, conf)
	close(release)
	<-done

	if n, _ := r.p.memory.Peek(r.clock.Now().UnixNano(), "llm", request.HashKey("k1")); n != 700 {
		t.Errorf("the reloaded instance counts %d for k1, want the 700 reported", n)
	}

	h.backend = http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) {
		rw.Header().Set("X-Usage", "100")
	})

	// 700 + a reserve of 300 fits; then 800 + 300 does not.
	for i, want := range []int{200, 429} {
		if rec := r.key("k1"); rec.Code != want {
			t.Errorf("request %d after the reload: %d, want %d", i+1, rec.Code, want)
		}
	}
}

// An event stream's cost is charged once the event that states it is read,
// before the client has it or the stream's [DONE].
func TestStreamedCostChargedBeforeItsEventLeaves(t *testing.T) {
	h := newHarness(t, meteredRoute("json:usage.total_tokens", 0))
	h.backend = http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) {
		rw.Header().Set("Content-Type", "text/event-stream")
		_, _ = rw.Write([]byte("data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n"))
		_, _ = rw.Write([]byte("data: {\"usage\":{\"total_tokens\":400}}\n\n"))
		_, _ = rw.Write([]byte("data: [DONE]\n\n"))
	})

	w := &watchCount{ResponseRecorder: httptest.NewRecorder(), count: func() int64 {
		n, _ := h.p.memory.Peek(h.clock.Now().UnixNano(), "llm", request.HashKey("k1"))
		return n
	}}

	req := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil)
	req.Header.Set("X-Api-Key", "k1")
	h.h.ServeHTTP(w, req)

	if len(w.seen) != 3 || w.seen[0] != 1 || w.seen[1] != 400 || w.seen[2] != 400 {
		t.Errorf("counts at the three writes: %v, want [1 400 400]: the usage event charged before it leaves", w.seen)
	}

	if n := w.count(); n != 400 {
		t.Errorf("k1 counts %d once the stream ended, want 400", n)
	}
}
