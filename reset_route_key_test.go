package tierlimit

import (
	"net/http"
	"net/url"
	"testing"
)

// The reset key of a route keyed by ip is the client's address, bare, as
// the status page lists it (docs/operations.md): a reset of it lets a
// client the route refused in again, on memory and on Redis; an IPv6
// client's key is its /64 prefix.
func TestResetOfAnIPKeyedRouteTakesTheBareAddress(t *testing.T) {
	login := func(c *Config) {
		c.Routes = []RouteConfig{{Name: "auth_login", Methods: []string{"POST"}, Paths: []string{"/auth/login"}, Key: "ip", Points: 2, Duration: "60s"}}
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
