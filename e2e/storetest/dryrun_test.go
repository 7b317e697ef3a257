package storetest

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"

	"github.com/tierlimit/tierlimit"
	"github.com/tierlimit/tierlimit/config"
)

// TestDryRunRuleAgainstMiniredis: global in dry run (2 points), ip enforced
// (3 points), for each algorithm of global. The first three requests pass,
// the third over global's points; a fixed global counts all three, a
// sliding or token-bucket one the two it holds. The fourth, refused by ip,
// leaves every key as it was, global's included.
func TestDryRunRuleAgainstMiniredis(t *testing.T) {
	for _, tc := range []struct{ algorithm, want string }{
		{"fixed", "3"}, {"sliding", "2"}, {"tokenbucket", ""},
	} {
		m := miniredis.RunT(t)
		m.SetTime(time.Date(2026, 6, 15, 10, 0, 0, 0, time.UTC))

		cfg := tierlimit.CreateConfig()
		cfg.Store = "redis"
		cfg.Redis.Address = m.Addr()
		cfg.Redis.Timeout = "1s"
		cfg.Global = layerOf(tc.algorithm, true)
		cfg.Global.DryRun = true
		cfg.IP = config.LayerConfig{Points: 3, Duration: "1h"}

		name := "dryrule-" + tc.algorithm + "@test"

		h, err := tierlimit.New(context.Background(), http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}), cfg, name)
		if err != nil {
			t.Fatal(err)
		}

		send := func() int {
			req := httptest.NewRequest(http.MethodGet, "/api", nil)
			req.RemoteAddr = "203.0.113.1:1"
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)

			return rec.Code
		}

		for i := 0; i < 3; i++ {
			if code := send(); code != http.StatusOK {
				t.Fatalf("%s: request %d: %d", tc.algorithm, i+1, code)
			}
		}

		key := "ratelimit:" + name + ":global:global"

		got := ""
		switch tc.algorithm {
		case "fixed":
			got, _ = m.Get(key)
		case "sliding":
			got = m.HGet(key, "c")
		}

		if got != tc.want {
			t.Fatalf("%s: global holds %q, want %q", tc.algorithm, got, tc.want)
		}

		before := keyState(t, m)

		if code := send(); code != http.StatusTooManyRequests {
			t.Fatalf("%s: request 4: %d, want ip's 429", tc.algorithm, code)
		}

		if after := keyState(t, m); after != before {
			t.Fatalf("%s: the refused request changed Redis:\nbefore\n%safter\n%s", tc.algorithm, before, after)
		}
	}
}
