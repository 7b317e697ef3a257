package tierlimit

import (
	"net/http"
	"strconv"
	"strings"
	"testing"
)

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
		c.IP = LayerConfig{Points: 50, Duration: "60s"}
		c.Principal.CredentialHeaders = []string{"Authorization"}
	}
}

// llmPrincipal is the instance after ForwardAuth: 1000 tokens a minute per
// principal, as the answers report them, 100 reserved a request.
func llmPrincipal(c *Config) {
	c.Global.Points = 0
	c.IP.Points = 0
	c.Principal.UserHeader = "X-Auth-User"
	c.Routes = []RouteConfig{{
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
