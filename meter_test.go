package tierlimit

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/rand"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/config"
	"github.com/tierlimit/tierlimit/lifetime"
	"github.com/tierlimit/tierlimit/redisresp"
	"github.com/tierlimit/tierlimit/redisstore"
	"github.com/tierlimit/tierlimit/request"
	"github.com/tierlimit/tierlimit/rule"
)

// meteredRoute is the route: 1000 points a minute per API key,
// charged what the response reports at source, each request holding
// reserve points while in flight (0: the default, 1).
func meteredRoute(source string, reserve int) func(c *Config) {
	return func(c *Config) {
		c.Global.Points = 0
		c.IP.Points = 0
		c.Routes = []config.RouteConfig{{
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
		c.Global = config.LayerConfig{Points: 3, Duration: "60s"}
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
	route := func(mutate func(r *config.RouteConfig)) func(c *Config) {
		return func(c *Config) {
			r := config.RouteConfig{Name: "llm", Paths: []string{"/v1/"}, Points: 1000, Duration: "60s", CostFrom: "json:usage.total_tokens"}
			mutate(&r)
			c.Routes = []config.RouteConfig{r}
		}
	}

	for _, tc := range []struct {
		name   string
		mutate func(c *Config)
		want   string // "" when valid
	}{
		{"json", route(func(r *config.RouteConfig) {}), ""},
		{"header and reserve", route(func(r *config.RouteConfig) { r.CostFrom, r.Reserve = "header:X-Usage", 1000 }), ""},
		{"bad source", route(func(r *config.RouteConfig) { r.CostFrom = "body:usage" }), `routes[0].costFrom = "body:usage": unknown source: must start with "llm:", "json:" or "header:"`},
		{"a misspelt term of a sum", route(func(r *config.RouteConfig) { r.CostFrom = "llm:input + 4*llm:inptu" }), `routes[0].costFrom = "llm:input + 4*llm:inptu": the term "4*llm:inptu": unknown source`},
		{"a weight with four decimals", route(func(r *config.RouteConfig) { r.CostFrom = "0.1255*llm:output" }), `routes[0].costFrom = "0.1255*llm:output": the weight "0.1255"`},
		{"a sum", route(func(r *config.RouteConfig) {
			r.CostFrom = "llm:input + 0.5*llm:cachedInput + 4*json:usage.x + header:X-Extra"
		}), ""},
		{"bad header", route(func(r *config.RouteConfig) { r.CostFrom = "header:X Usage" }), `routes[0].costFrom = "header:X Usage"`},
		{"reserve past the points", route(func(r *config.RouteConfig) { r.Reserve = 1001 }), `routes[0].reserve = "1001"`},
		{"reserve past a burst", route(func(r *config.RouteConfig) { r.Algorithm, r.Burst, r.Reserve = "tokenbucket", 100, 101 }), `routes[0].reserve = "101"`},
		{"negative reserve", route(func(r *config.RouteConfig) { r.Reserve = -1 }), `routes[0].reserve = "-1"`},
		{"reserve without costFrom", route(func(r *config.RouteConfig) { r.CostFrom, r.Reserve = "", 5 }), `routes[0].reserve = "5": takes costFrom`},
		{"with countStatus", route(func(r *config.RouteConfig) { r.CountStatus = []int{401} }), `routes[0].costFrom = "json:usage.total_tokens": cannot be combined with countStatus`},
		{"on a route that is off", route(func(r *config.RouteConfig) { r.Points = 0 }), `routes[0].costFrom`},
		{"cost past the points charges the other layers", route(func(r *config.RouteConfig) { r.Points, r.Cost = 10, 20 }), ""},
		{"on a concurrency route", route(func(r *config.RouteConfig) { r.Algorithm = "concurrency" }), `routes[0].costFrom = "json:usage.total_tokens": charges points when the response ends`},
		{"on a route plan of concurrency", func(c *Config) {
			route(func(r *config.RouteConfig) {
				r.Plans = map[string]config.PlanConfig{"pro": {Points: 5, Duration: "60s", Algorithm: "concurrency"}}
			})(c)
			c.Principal.UserHeader, c.Principal.PlanHeader = "X-Auth-User", "X-Auth-Plan"
			c.Plans = map[string]config.PlanConfig{"pro": {Points: 5, Duration: "60s"}}
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

	type meter struct {
		Source     string `json:"source"`
		Reserve    int64  `json:"reserve"`
		Reserved   int64  `json:"reserved"`
		Settled    int64  `json:"settledPoints"`
		Unreported int64  `json:"unreported"`
	}

	var doc struct {
		Layers []struct {
			Name     string `json:"name"`
			CostFrom *meter `json:"costFrom"`
		} `json:"layers"`
	}

	if err := json.Unmarshal(h.get("/_rl", local).Body.Bytes(), &doc); err != nil {
		t.Fatal(err)
	}

	var llm *meter
	for _, l := range doc.Layers {
		if l.Name == "llm" {
			llm = l.CostFrom
		}
	}

	want := meter{Source: "header:X-Usage", Reserve: 300, Reserved: 1, Settled: 40, Unreported: 1}
	if llm == nil || *llm != want {
		t.Errorf("status of llm: costFrom %+v, want %+v", llm, want)
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
		c.IP = config.LayerConfig{Points: 1, Duration: "60s"}
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
		c.Global = config.LayerConfig{Points: 100, Duration: "60s"}
		c.Principal.UserHeader = "X-Auth-User"
		c.Principal.PlanHeader = "X-Auth-Plan"
		c.Plans = map[string]config.PlanConfig{"pro": {Points: 1000, Duration: "60s"}}
		c.Routes[0].Key = "principal"
		c.Routes[0].Cost = 5
		c.Routes[0].Plans = map[string]config.PlanConfig{"pro": {Points: 5000, Duration: "60s"}}
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

// reportsAsAsked is a backend that reports the cost the request's X-Cost
// names, in X-Usage; none for "none".
var reportsAsAsked = http.HandlerFunc(func(rw http.ResponseWriter, req *http.Request) {
	if v := req.Header.Get("X-Cost"); v != "none" {
		rw.Header().Set("X-Usage", v)
	}
	_, _ = rw.Write([]byte("ok"))
})

// meteredShape is a seeded configuration with a costFrom route of the
// algorithm, its reserve drawn, beside global.
func meteredShape(seed int64, algorithm string) func(c *Config) {
	rng := rand.New(rand.NewSource(seed))
	reserve := []int{0, 100, 300}[rng.Intn(3)]
	global := 40 + rng.Intn(20)

	return func(c *Config) {
		meteredRoute("header:X-Usage", reserve)(c)
		c.Global = config.LayerConfig{Points: global, Duration: "60s"}
		c.Routes[0].Algorithm = algorithm
		if algorithm == "tokenbucket" {
			// Redis refills on its own clock, which runs while the test's
			// stands still: a refill too slow to matter during a run.
			c.Routes[0].Burst, c.Routes[0].Duration = 1000, "24h"
		}
	}
}

// agreeMetered sends the seeded script of metered requests to a (memory)
// and b, with the costs each response reports drawn, and compares the
// answers.
func agreeMetered(t *testing.T, name string, seed int64, a, b *harness, afterEach func()) {
	t.Helper()

	rng := rand.New(rand.NewSource(seed))
	refusals := 0

	for i := 0; i < 120; i++ {
		hdr := map[string]string{"X-Api-Key": "k" + strconv.Itoa(rng.Intn(3)), "X-Cost": strconv.Itoa(rng.Intn(400))}
		if rng.Intn(10) == 0 {
			hdr["X-Cost"] = "none"
		}

		ra := a.do(http.MethodPost, "/v1/x", "203.0.113.1:1", hdr)
		rb := b.do(http.MethodPost, "/v1/x", "203.0.113.1:1", hdr)

		if msg := differ(ra, rb, a.p.name, b.p.name, 1); msg != "" {
			t.Errorf("%s: request %d (%v): %s", name, i, hdr, msg)
			return
		}

		if ra.Code == http.StatusTooManyRequests {
			refusals++
		}

		if afterEach != nil {
			afterEach()
		}
	}

	if refusals == 0 {
		t.Errorf("%s: no refusal: the script does not reach the limits", name)
	}
}

// TestStoresAgreeOnReservationsOnRedisServer: seeded costFrom routes
// (fixed, sliding, token bucket; reserves of 1, 100, 300; reported costs
// below and past the reserve, and none) answer alike in memory, on exact
// Redis and, for fixed windows, on synced Redis, and end with the same
// counts.
func TestStoresAgreeOnReservationsOnRedisServer(t *testing.T) {
	addr, admin := redisServer(t)

	for seed := int64(1); seed <= 4; seed++ {
		for _, algorithm := range []string{"fixed", "sliding", "tokenbucket"} {
			name := algorithm + " seed " + strconv.FormatInt(seed, 10)
			conf := meteredShape(seed, algorithm)

			a := newHarness(t, conf)
			a.backend = reportsAsAsked
			b, _ := redisHarness(t, addr, with(conf, asACLUser))
			b.backend = reportsAsAsked
			agreeMetered(t, name+", exact", seed, a, b, nil)
			agreeCounts(t, name+", exact", a, b, admin, nil)

			if algorithm != "fixed" {
				continue
			}

			a = newHarness(t, conf)
			a.backend = reportsAsAsked
			b, _ = redisHarness(t, addr, with(with(conf, asACLUser), synced))
			b.backend = reportsAsAsked
			st := syncedOf(t, b)
			now := b.clock.Now().UnixNano()
			agreeMetered(t, name+", synced", seed, a, b, func() { mustSync(t, st, now) })

			if err := redisstore.SyncNow(st, now, true); err != nil {
				t.Fatalf("%s: the last sync: %v", name, err)
			}

			agreeCounts(t, name+", synced", a, b, admin, st)
		}
	}
}

// On exact Redis: three requests of 400 tokens, the fourth refused;
// another key allowed; Redis holds the 1200 reported.
func TestCostFromOnRedisServer(t *testing.T) {
	addr, admin := redisServer(t)

	h, _ := redisHarness(t, addr, with(meteredRoute("json:usage.total_tokens", 0), asACLUser))
	h.backend = jsonUsage(400)
	spendsAsReported(t, "exact", h)

	key := h.p.stores.redis.Prefix + "llm:" + request.HashKey("k1")
	if got := redisDo(t, admin, "GET", key).Str; got != "1200" {
		t.Errorf("Redis holds %q for k1, want 1200", got)
	}
}

// Ten simultaneous requests of reserve 300 on Redis: exactly three admitted.
func TestReserveBoundsRequestsInFlightOnRedisServer(t *testing.T) {
	addr, admin := redisServer(t)

	h, _ := redisHarness(t, addr, with(meteredRoute("header:X-Usage", 300), asACLUser))
	release := make(chan struct{})
	h.backend = http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) {
		<-release
		rw.Header().Set("X-Usage", "100")
	})

	var wg sync.WaitGroup
	codes := make(chan int, 10)

	for i := 0; i < 10; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			codes <- h.key("k1").Code
		}()
	}

	refused := 0
	for refused < 7 {
		select {
		case code := <-codes:
			if code != http.StatusTooManyRequests {
				t.Fatalf("a request answered %d before any was released", code)
			}
		case <-time.After(10 * time.Second):
			close(release)
			t.Fatalf("%d refused, then none in 10 s: want 7 refused while 3 are in flight", refused)
		}
		refused++
	}

	close(release)
	wg.Wait()
	close(codes)

	allowed := 0
	for code := range codes {
		if code == http.StatusOK {
			allowed++
		}
	}

	if allowed != 3 {
		t.Errorf("%d admitted, want 3", allowed)
	}

	key := h.p.stores.redis.Prefix + "llm:" + request.HashKey("k1")
	if got := redisDo(t, admin, "GET", key).Str; got != "300" {
		t.Errorf("Redis holds %q once settled, want 3 x 100", got)
	}

	// The refusals blocked nothing: what the settlement gave back is there
	// for the next requests (the block list holds no key of this layer).
	for i := 1; i <= 2; i++ {
		if code := h.key("k1").Code; code != http.StatusOK {
			t.Errorf("request %d after the settlement: %d, want 200", i, code)
		}
	}
}

// A cost reported while Redis is down goes to the fallback and is owed to
// Redis: once Redis answers again, it holds the charge.
func TestCostReportedDuringAnOutageIsPaidOnRecovery(t *testing.T) {
	addr, admin := redisServer(t)

	h, _ := redisHarness(t, addr, with(meteredRoute("header:X-Usage", 0), asACLUser))
	backend := h.p.stores.redis.Backend
	now := h.clock.Now().UnixNano()

	h.backend = http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) {
		// Redis fails while the request is in flight.
		backend.Failed(now, false, errTestOutage)
		rw.Header().Set("X-Usage", "700")
	})

	if rec := h.key("k1"); rec.Code != http.StatusOK {
		t.Fatalf("request: %d", rec.Code)
	}

	// The fallback starts from Redis's last answer, the reservation of 1.
	if n, _ := h.p.stores.redis.Local.Peek(now, "llm", request.HashKey("k1")); n != 700 {
		t.Errorf("the fallback holds %d, want 1 + the 699 beyond the reservation", n)
	}

	redisstore.PayOwed(h.p.stores.redis)

	key := h.p.stores.redis.Prefix + "llm:" + request.HashKey("k1")
	if got := redisDo(t, admin, "GET", key).Str; got != "700" {
		t.Errorf("Redis holds %q after the recovery, want 700", got)
	}
}

var errTestOutage = &testError{"redis went away"}

type testError struct{ s string }

func (e *testError) Error() string { return e.s }

// On Redis, a response that ends after its admission's window (by the
// plugin's clock) gives nothing back: Redis's key would be a later window's.
func TestGiveBackEndsWithTheAdmissionsWindowOnRedisServer(t *testing.T) {
	addr, admin := redisServer(t)

	h, _ := redisHarness(t, addr, with(meteredRoute("header:X-Usage", 300), asACLUser))
	h.backend = http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) {
		h.clock.Add(61 * time.Second)
		rw.Header().Set("X-Usage", "20")
	})

	h.key("k1")

	key := h.p.stores.redis.Prefix + "llm:" + request.HashKey("k1")
	if got := redisDo(t, admin, "GET", key).Str; got != "300" {
		t.Errorf("Redis holds %q, want the reservation of 300 kept: its window ended before the response", got)
	}
}

// A charge past the reservation adds to a key that holds 0 (its requests'
// points all given back) as to any other.
func TestSpendAddsToAKeyAtZeroOnRedisServer(t *testing.T) {
	addr, admin := redisServer(t)

	h, _ := redisHarness(t, addr, with(meteredRoute("header:X-Usage", 0), asACLUser))
	key := h.p.stores.redis.Prefix + "llm:" + request.HashKey("k1")
	redisDo(t, admin, "SET", key, "0", "PX", "60000")

	l := h.p.routes[0].layer
	spend(h.p.stores, &rule.Charge{Layers: []*rule.Layer{l}, Keys: []string{request.HashKey("k1")}, Now: h.clock.Now().UnixNano()}, 5)

	if got := redisDo(t, admin, "GET", key).Str; got != "5" {
		t.Errorf("Redis holds %q after a charge of 5 on 0, want 5", got)
	}
}

// A costFrom route beside a concurrency layer: the other layers' take is a
// part of the request's charge, whose Redis slot the release after the
// response finds.
func TestCostFromBesideAConcurrencyLayerOnRedisServer(t *testing.T) {
	addr, _ := redisServer(t)

	h, _ := redisHarness(t, addr, with(meteredRoute("header:X-Usage", 0), func(c *Config) {
		asACLUser(c)
		c.IP = config.LayerConfig{Points: 1, Duration: "60s", Algorithm: "concurrency"}
	}))
	h.backend = http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) {
		rw.Header().Set("X-Usage", "10")
	})

	m := newHarness(t, func(c *Config) {
		meteredRoute("header:X-Usage", 0)(c)
		c.IP = config.LayerConfig{Points: 1, Duration: "60s", Algorithm: "concurrency"}
	})
	m.backend = h.backend

	for i := 1; i <= 3; i++ {
		if code := h.key("k1").Code; code != http.StatusOK {
			t.Fatalf("Redis: request %d, one after the other: %d, want 200 (the slot of the one before released)", i, code)
		}

		if code := m.key("k1").Code; code != http.StatusOK {
			t.Fatalf("memory: request %d, one after the other: %d, want 200", i, code)
		}
	}
}

// A charge past the reservation on a sliding key that holds only the window
// before (its current window not started in Redis) starts the current
// window, the old count as the previous one's, as memory rotates.
func TestSpendStartsASlidingKeysWindowOnRedisServer(t *testing.T) {
	addr, admin := redisServer(t)

	h, _ := redisHarness(t, addr, with(meteredRoute("header:X-Usage", 0), func(c *Config) {
		asACLUser(c)
		c.Routes[0].Algorithm = "sliding"
	}))
	key := h.p.stores.redis.Prefix + "llm:" + request.HashKey("k1")
	redisDo(t, admin, "HSET", key, "c", "70", "p", "5")
	redisDo(t, admin, "PEXPIRE", key, "30000") // half of the current 60 s window left

	l := h.p.routes[0].layer
	spend(h.p.stores, &rule.Charge{Layers: []*rule.Layer{l}, Keys: []string{request.HashKey("k1")}, Now: h.clock.Now().UnixNano()}, 9)

	c, p := redisDo(t, admin, "HGET", key, "c").Str, redisDo(t, admin, "HGET", key, "p").Str
	ttl := redisDo(t, admin, "PTTL", key).Int
	if c != "9" || p != "70" || ttl <= 60000 || ttl > 90000 {
		t.Errorf("sliding key after a charge of 9: c %q, p %q, PTTL %d; want 9, 70 and within (60000, 90000]", c, p, ttl)
	}
}

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
		c.IP = config.LayerConfig{Points: 100, Duration: "60s"}
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
		c.IP = config.LayerConfig{Points: 600, Duration: "60s"}
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
		c.IP = config.LayerConfig{Points: 600, Duration: "60s"}
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

// llmEdge is the edge of the recommended chain on exact Redis at addr
// (timeout: a backend of its own), an ip layer, credentialed requests left
// to the instance after ForwardAuth.
func llmEdge(addr, timeout string) func(c *Config) {
	return func(c *Config) {
		c.Store = "redis"
		c.Redis.Address = addr
		c.Redis.Timeout = timeout
		asACLUser(c)
		c.Global.Points = 0
		c.IP = config.LayerConfig{Points: 50, Duration: "60s"}
		c.Principal.CredentialHeaders = []string{"Authorization"}
	}
}

// llmPrincipal is the instance after ForwardAuth: 1000 tokens a minute per
// principal, as the answers report them, 100 reserved a request.
func llmPrincipal(c *Config) {
	c.Global.Points = 0
	c.IP.Points = 0
	c.Principal.UserHeader = "X-Auth-User"
	c.Routes = []config.RouteConfig{{
		Name: "tpm", Paths: []string{"/v1/"}, Key: "principal", Points: 1000, Duration: "60s",
		CostFrom: "json:usage.total_tokens", Reserve: 100,
	}}
}

// TestTheInstanceAfterForwardAuthSettlesItsOwnCosts: in the chain [edge on
// exact Redis, ForwardAuth, principal instance], a credentialed request
// reaches the principal instance through the edge's watching writer; the
// principal instance still settles its costFrom route in its own store
// (memory, exact Redis, synced Redis), so 500-token answers are admitted
// twice, not points/reserve times, and its events name it, not the edge.
func TestTheInstanceAfterForwardAuthSettlesItsOwnCosts(t *testing.T) {
	addr, admin := redisServer(t)

	for i, store := range []string{"memory", "exact", "synced"} {
		// The stores of each case on a backend of their own (the registry's,
		// by configuration): a failure of one case leaves the next none.
		timeout := strconv.Itoa(i+1) + "s"

		t.Run(store, func(t *testing.T) {
			edge := newProxiedHarness(t, llmEdge(addr, timeout))
			edge.backend = http.HandlerFunc(func(rw http.ResponseWriter, req *http.Request) {
				rw.Header().Set("Content-Type", "application/json")
				if req.Header.Get("X-Auth-User") == "bob" {
					_, _ = rw.Write([]byte(`{"id":"x"}`))
					return
				}
				_, _ = rw.Write([]byte(`{"id":"x","usage":{"total_tokens":500}}`))
			})

			conf := llmPrincipal
			if store != "memory" {
				conf = with(conf, func(c *Config) {
					c.Store = "redis"
					c.Redis.Address = addr
					c.Redis.Timeout = timeout
					asACLUser(c)
					if store == "synced" {
						synced(c)
					}
				})
			}

			principal := newHarness(t, conf)
			chained(edge, fakeForwardAuth, principal)

			sync := func() {}
			if store == "synced" {
				st := syncedOf(t, principal)
				sync = func() { mustSync(t, st, edge.clock.Now().UnixNano()) }
			}

			alice := map[string]string{"Authorization": "Bearer alice"}
			for i, want := range []int{200, 200, 429, 429} {
				rec := edge.do(http.MethodPost, "/v1/chat/completions", "203.0.113.1:1", alice)
				sync()

				if rec.Code != want {
					t.Fatalf("request %d of alice (500 tokens each, 1000 a minute): %d, want %d", i+1, rec.Code, want)
				}
			}

			if store != "memory" {
				keys := redisDo(t, admin, "KEYS", principal.p.stores.redis.Prefix+"tpm:*").Array
				if len(keys) != 1 {
					t.Fatalf("Redis holds %d keys of the route, want 1 (alice's window)", len(keys))
				}

				if got := redisDo(t, admin, "GET", keys[0].Str).Str; got != "1000" {
					t.Errorf("Redis holds %s = %q, want the 1000 the answers reported", keys[0].Str, got)
				}
			}

			// An answer that states no cost: reported by the instance whose route it is.
			bob := map[string]string{"Authorization": "Bearer bob"}
			if rec := edge.do(http.MethodPost, "/v1/chat/completions", "203.0.113.1:1", bob); rec.Code != http.StatusOK {
				t.Fatalf("bob: %d, want 200", rec.Code)
			}

			line := ""
			for _, l := range strings.Split(principal.events.String(), "\n") {
				if strings.Contains(l, "RATE_LIMIT_COST_UNREPORTED") {
					line = l
				}
			}

			if !strings.Contains(line, `"middleware":`+strconv.Quote(principal.p.name)) {
				t.Errorf("the principal instance logged no RATE_LIMIT_COST_UNREPORTED of its own: %q; the edge logged %q", principal.events.String(), edge.events.String())
			}
		})
	}
}

// The RateLimit fields' items: every layer a metered request's answer names.

// gatewayConfig is an LLM gateway's: 50 requests a minute per IP, 1000
// tokens a minute per API key charged what the response reports (100
// reserved while in flight) and, with slots, 2 requests in flight per key.
func gatewayConfig(slots bool) func(c *Config) {
	return func(c *Config) {
		c.Global.Points = 0
		c.IP.Points, c.IP.Duration = 50, "60s"
		c.Routes = []config.RouteConfig{{
			Name: "chat", Paths: []string{"/v1/"}, Key: "header:X-Api-Key", Points: 1000, Duration: "60s",
			CostFrom: "json:usage.total_tokens", Reserve: 100,
		}}
		if slots {
			c.Routes = append(c.Routes, config.RouteConfig{
				Name: "inflight", Paths: []string{"/v1/"}, Key: "header:X-Api-Key", Points: 2, Duration: "5m", Algorithm: "concurrency",
			})
		}
	}
}

// A metered client reads every layer that admitted its request in
// RateLimit-Policy and each one's state in RateLimit, the most
// restrictive first (X-RateLimit-* shows it), then the request's order:
// the tokens it has left although a concurrency layer has fewer left.
func TestAMeteredClientReadsEveryPolicyInItsHeaders(t *testing.T) {
	addr, _ := redisServer(t)
	redis := func(c *Config) {
		c.Store = "redis"
		c.Redis.Address = addr
		asACLUser(c)
	}

	for _, tc := range []struct {
		name  string
		store func(c *Config)
		slots bool
	}{
		{"memory", func(*Config) {}, true},
		{"exact redis", redis, true},
		{"synced redis", func(c *Config) { redis(c); synced(c) }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, func(c *Config) {
				gatewayConfig(tc.slots)(c)
				tc.store(c)
			})
			h.backend = jsonUsage(100)

			policy := `"ip";q=50;w=60, "chat";q=1000;w=60`
			rate := []string{`"ip";r=49;t=60, "chat";r=900;t=60`, `"ip";r=48;t=60, "chat";r=800;t=60`}
			if tc.slots {
				policy = `"inflight";q=2;w=300;qu="concurrent-requests", ` + policy
				rate = []string{`"inflight";r=1;t=300, ` + rate[0], `"inflight";r=1;t=300, ` + rate[1]}
			}

			for i, want := range rate {
				rec := h.key("k1")
				if rec.Code != http.StatusOK {
					t.Fatalf("request %d: %d, want 200", i+1, rec.Code)
				}

				if got := rec.Header().Get("RateLimit-Policy"); got != policy {
					t.Errorf("request %d: RateLimit-Policy %q, want %q", i+1, got, policy)
				}

				if got := rec.Header().Get("RateLimit"); got != want {
					t.Errorf("request %d: RateLimit %q, want %q", i+1, got, want)
				}
			}
		})
	}
}

// Without both a costFrom route and a concurrency layer, an answer names
// one layer, the one with the fewest left: a metered client whose slots
// are not shown reads its tokens there when they are the fewest, and the
// items' recording and formatting cost the other requests nothing.
func TestAnswersWithoutBothTokensAndSlotsNameOneLayer(t *testing.T) {
	for _, tc := range []struct {
		name         string
		config       func(c *Config)
		policy, rate string
	}{
		{"tokens", gatewayConfig(false), `"ip";q=50;w=60`, `"ip";r=49;t=60`},
		{"slots", func(c *Config) {
			gatewayConfig(true)(c)
			c.Routes = c.Routes[1:]
		}, `"inflight";q=2;w=300;qu="concurrent-requests"`, `"inflight";r=1;t=300`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, tc.config)
			h.backend = jsonUsage(100)

			rec := h.key("k1")
			if rec.Code != http.StatusOK {
				t.Fatalf("%d, want 200", rec.Code)
			}

			if got := rec.Header().Get("RateLimit-Policy"); got != tc.policy {
				t.Errorf("RateLimit-Policy %q, want %q", got, tc.policy)
			}

			if got := rec.Header().Get("RateLimit"); got != tc.rate {
				t.Errorf("RateLimit %q, want %q", got, tc.rate)
			}
		})
	}
}

// A month's token budget beside ip and slots: its item in RateLimit-Policy
// states the month's length (rule.MonthPolicyAt), its RateLimit item the
// seconds to the month's end, after the shown slots' and ip's.
func TestAMonthlyTokenBudgetIsAnItemOfItsMonth(t *testing.T) {
	h := newHarness(t, func(c *Config) {
		gatewayConfig(true)(c)
		c.Routes[0].Duration, c.Routes[0].Calendar = "", "month"
	})
	h.clock.mu.Lock()
	h.clock.now = utc(2026, 2, 10, 12, 0, 0)
	h.clock.mu.Unlock()
	h.backend = jsonUsage(100)

	rec := h.key("k1")
	if rec.Code != http.StatusOK {
		t.Fatalf("%d, want 200", rec.Code)
	}

	if got, want := rec.Header().Get("RateLimit-Policy"), `"inflight";q=2;w=300;qu="concurrent-requests", "ip";q=50;w=60, "chat";q=1000;w=2419200`; got != want {
		t.Errorf("RateLimit-Policy %q, want %q", got, want)
	}

	if got, want := rec.Header().Get("RateLimit"), `"inflight";r=1;t=300, "ip";r=49;t=60, "chat";r=900;t=1598400`; got != want {
		t.Errorf("RateLimit %q, want %q", got, want)
	}
}

// fakeTimers stands in for time.AfterFunc: the grace timers are fired by the
// test, so no test waits for releaseGrace.
type fakeTimers struct {
	started chan func()
}

func newFakeTimers(r *lifetime.HeldRegistry) *fakeTimers {
	ft := &fakeTimers{started: make(chan func(), 16)}
	r.After = func(d time.Duration, f func()) {
		if d != lifetime.ReleaseGrace {
			panic("grace timer of " + d.String())
		}

		ft.started <- f
	}

	return ft
}

// next returns the next grace timer started; context.AfterFunc runs the
// release on a goroutine of its own, hence the wait (with a deadline).
func (ft *fakeTimers) next(t *testing.T) func() {
	t.Helper()

	select {
	case f := <-ft.started:
		return f
	case <-time.After(5 * time.Second):
		t.Fatal("no grace timer started after the last holder's ctx was cancelled")
		return nil
	}
}

// ownBackends gives the test a registry of Redis backends of its own, whose
// grace timers it fires (fakeTimers), in place of the process's.
func ownBackends(t *testing.T) *fakeTimers {
	t.Helper()

	saved := redisstore.Backends
	reg := &redisstore.BackendRegistry{ByConfig: lifetime.NewHeldRegistry(redisstore.CloseBackend)}
	ft := newFakeTimers(reg.ByConfig)
	redisstore.Backends = reg
	t.Cleanup(func() { redisstore.Backends = saved })

	return ft
}

// streamOnRedis is a costFrom route reserving 300 of 1000 tokens a minute
// per X-Api-Key, beside a concurrency layer of 2 per IP, on exact Redis at
// addr with the timeout given (a backend per timeout).
func streamOnRedis(addr, timeout string) func(c *Config) {
	return with(meteredRoute("json:usage.total_tokens", 300), func(c *Config) {
		c.Store = "redis"
		c.Redis.Address = addr
		c.Redis.Timeout = timeout
		asACLUser(c)
		c.IP = config.LayerConfig{Points: 2, Duration: "60s", Algorithm: "concurrency"}
	})
}

// streamAcrossReload opens a stream on an instance of streamOnRedis, reloads
// to reload's configuration (the old ctx cancelled), lets the old backend's
// grace pass (its pool closed then), calls during with the new instance,
// then has the stream report 700 tokens and end. It returns the old
// instance, the new one and the keys of the route and of the slots.
func streamAcrossReload(t *testing.T, addr string, reload func(c *Config), during func(r *harness)) (h, r *harness, key, slots string) {
	t.Helper()

	ft := ownBackends(t)
	h = newProxiedHarness(t, streamOnRedis(addr, "1s"))
	sb := newStepBackend("text/event-stream")
	h.backend = sb

	old := h.p.stores.redis.Backend
	key = h.p.stores.redis.Prefix + "llm:" + request.HashKey("k1")
	slots = h.p.stores.redis.Prefix + "ip:203.0.113.1"

	o := h.open(http.MethodPost, "/v1/chat/completions", "203.0.113.1:1", map[string]string{"X-Api-Key": "k1"})
	s := sb.next(t)
	s.send("data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}],\"usage\":null}\n\n")
	o.readUntil("\n\n")

	r = reloaded(t, h, reload)
	ft.next(t)() // the old backend's grace has passed

	if _, err := old.Pool.(*redisresp.Pool).Do("PING"); !errors.Is(err, redisresp.ErrClosed) {
		t.Fatalf("the old backend's pool after its grace: %v, want ErrClosed", err)
	}

	if during != nil {
		during(r)
	}

	s.send("data: {\"choices\":[],\"usage\":{\"total_tokens\":700}}\n\n")
	s.send("data: [DONE]\n\n")
	s.end()
	o.readAll()
	o.wait()

	return h, r, key, slots
}

// TestAReloadOfRedisSettingsKeepsTheSettlementOfAStreamInFlight: a stream
// on exact Redis (a costFrom route reserving 300, beside a concurrency
// layer) is held open across a reload that changes a redis setting (a new
// backend) and past the old backend's release grace, which closes the old
// pool, then reports 700 and ends: the settlement and the slot's release
// go through the new pool. The key counts 700, the slot is free.
func TestAReloadOfRedisSettingsKeepsTheSettlementOfAStreamInFlight(t *testing.T) {
	addr, admin := redisServer(t)

	_, _, key, slots := streamAcrossReload(t, addr, streamOnRedis(addr, "2s"), func(*harness) {
		if got := redisDo(t, admin, "ZCARD", slots0(admin)).Int; got != 1 {
			t.Fatalf("%d slots taken in Redis while the stream runs, want 1", got)
		}
	})

	if got := redisDo(t, admin, "GET", key).Str; got != "700" {
		t.Errorf("Redis holds %q for the stream's key, want the 700 it reported", got)
	}

	if got := redisDo(t, admin, "ZCARD", slots).Int; got != 0 {
		t.Errorf("%d slots taken in Redis once the stream has ended, want 0", got)
	}
}

// slots0 is the one concurrency key on the server.
func slots0(admin *redisresp.Pool) string {
	v, err := admin.Do("KEYS", "*:ip:*")
	if err != nil || len(v.Array) != 1 {
		return ""
	}

	return v.Array[0].Str
}

// TestASettlementAfterAReloadIsOwedDuringAnOutage: as above, but the new
// configuration's Redis is in an outage when the stream ends: the reported
// cost beyond the reservation is owed, as the fallback's charges are, and
// paid when Redis answers again.
func TestASettlementAfterAReloadIsOwedDuringAnOutage(t *testing.T) {
	addr, admin := redisServer(t)

	_, r, key, _ := streamAcrossReload(t, addr, streamOnRedis(addr, "2s"), func(r *harness) {
		r.p.stores.redis.Backend.Failed(r.clock.Now().UnixNano(), false, errors.New("an outage"))
	})

	if got := redisDo(t, admin, "GET", key).Str; got != "300" {
		t.Fatalf("Redis holds %q during the outage, want the reservation of 300 (the rest owed)", got)
	}

	b := r.p.stores.redis.Backend
	redisstore.StopProbe(b) // the test recovers it
	b.Succeeded(r.clock.Now().UnixNano())

	deadline := time.Now().Add(10 * time.Second)
	for redisDo(t, admin, "GET", key).Str != "700" {
		if time.Now().After(deadline) {
			t.Fatalf("Redis holds %q once it answers again, want the 700 reported", redisDo(t, admin, "GET", key).Str)
		}

		time.Sleep(5 * time.Millisecond)
	}
}

// TestASettlementAfterAReloadToMemoryIsChargedInMemory: the reload puts the
// middleware in memory: the cost the stream reported is charged to the
// middleware's memory counters (its reservation, as Redis reported it, and
// the rest), which the new instance counts in.
func TestASettlementAfterAReloadToMemoryIsChargedInMemory(t *testing.T) {
	addr, _ := redisServer(t)

	_, r, _, _ := streamAcrossReload(t, addr, with(streamOnRedis(addr, "2s"), func(c *Config) { c.Store = "memory" }), nil)

	if got := peekCount(r.p.memory, r.clock.Now().UnixNano(), "llm", request.HashKey("k1")); got != 700 {
		t.Errorf("memory counts %d for the stream's key, want the 700 reported", got)
	}
}
