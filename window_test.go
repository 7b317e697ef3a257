package tierlimit

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/config"
)

var t0 = time.Date(2026, 6, 15, 10, 0, 0, 0, time.UTC).UnixNano()

func testLayer(s *windowStore, name string, points int64, d time.Duration) *layer {
	return newLayer(s, config.Rule{Name: name, Points: points, Duration: d}, keyOfClient)
}

// hit is one layer's outcome of a request.
type hit struct {
	count, reset int64
	firstRefusal bool
}

func hitOnce(s *windowStore, now int64, l *layer, key string) hit {
	var t tally

	take(storeOf(s), &t, chargeOf([]*layer{l}, key, "", nil, now, false))

	return hit{count: t.Count, reset: t.Reset, firstRefusal: t.Firsts != 0}
}

// takeIn runs take on s (storeOf) and returns the tally.
func takeIn(s interface{}, now int64, layers []*layer, client, principal string, all bool) tally {
	var t tally

	take(storeOf(s), &t, chargeOf(layers, client, principal, nil, now, all))

	return t
}

func peekCount(s *windowStore, now int64, layer, key string) int64 {
	count, _ := s.Peek(now, layer, key)
	return count
}

func TestKeysByKind(t *testing.T) {
	cases := []struct {
		kind              int
		client, principal string
		want              string
	}{
		{keyOfClient, "1.2.3.4", "alice", "1.2.3.4"},
		{keyOfPrincipal, "1.2.3.4", "alice", "alice"},
		{keyOfConst, "1.2.3.4", "alice", "global"},
		{keyOfPrincipalElseClient, "1.2.3.4", "alice", "alice"},
		{keyOfPrincipalElseClient, "1.2.3.4", "", "ip:1.2.3.4"},
	}

	for _, tc := range cases {
		l := &layer{Limits: limits{KeyKind: tc.kind, ConstKey: "global"}}
		if got := keyFor(l, tc.client, tc.principal, nil); got != tc.want {
			t.Errorf("kind %d: %q, want %q", tc.kind, got, tc.want)
		}
	}
}

func TestRegistrySharesStoresByName(t *testing.T) {
	a := registry.get(context.Background(), "shared-test@file", 10)
	b := registry.get(context.Background(), "shared-test@file", 20)
	c := registry.get(context.Background(), "other-test@file", 10)

	if a != b {
		t.Fatal("same middleware name got two stores")
	}

	if a == c {
		t.Fatal("different middleware names share a store")
	}

	if a.Max != 20 {
		t.Fatalf("reload did not apply maxTracked: %d", a.Max)
	}
}

// The general path and the fast path keep the same rule.
func TestEvictionSparesTheRequestsCountersOnEveryPath(t *testing.T) {
	for _, headers := range []bool{true, false} {
		h := newHarness(t, func(c *Config) {
			c.MaxTracked = 2
			c.Global = LayerConfig{Points: 5, Duration: "60s"}
			c.IP = LayerConfig{Points: 50, Duration: "60s"}
			c.Assets.Points, c.User.Points, c.Service.Points = 0, 0, 0
			c.Headers = headers // off: serveGeneral
		})

		if (h.p.mode == modeAnonymous) != headers {
			t.Fatalf("headers %v: mode %d", headers, h.p.mode)
		}

		allowed := 0

		for i := 0; i < 10; i++ {
			if rec := h.get("/api", "198.51.100."+strconv.Itoa(i)+":1"); rec.Code == http.StatusOK {
				allowed++
			}
		}

		if allowed != 5 {
			t.Fatalf("headers %v: %d of 10 allowed through global 5 at maxTracked 2", headers, allowed)
		}
	}
}

// TestEvictionKeepsLimitedKeys: at maxTracked, a client over its limit is
// not evicted by others filling the table, on the fast and the general
// path; evictions count (when every key is limited, the oldest goes:
// memstore's TestEvictionTakesTheOldestWhenEveryKeyIsLimited).
func TestEvictionKeepsLimitedKeys(t *testing.T) {
	for _, headers := range []bool{true, false} {
		h := newHarness(t, func(c *Config) {
			c.MaxTracked = 1000
			c.Global.Points = 0
			c.IP = LayerConfig{Points: 5, Duration: "60s"}
			c.Assets.Points, c.User.Points, c.Service.Points = 0, 0, 0
			c.Headers = headers // off: serveGeneral
		})

		for i := 0; i < 6; i++ {
			h.get("/api", "203.0.113.9:1")
		}

		for i := 0; i < 3000; i++ {
			h.get("/api", "10."+strconv.Itoa(i/65536)+"."+strconv.Itoa(i/256%256)+"."+strconv.Itoa(i%256)+":1")
		}

		for i := 0; i < 3; i++ {
			if rec := h.get("/api", "203.0.113.9:1"); rec.Code != http.StatusTooManyRequests {
				t.Fatalf("headers %v: the limited client after 3000 others: %d, want 429", headers, rec.Code)
			}
		}

		if n := h.p.memory.Evicted(); n != 2001 {
			t.Fatalf("headers %v: %d evictions, want 2001", headers, n)
		}
	}
}

// storeOf is what take and refund (stores.go) charge for a store the test
// holds: a memory store alone, or a Redis store with its fallback.
func storeOf(s interface{}) *stores {
	switch v := s.(type) {
	case *windowStore:
		return &stores{memory: v}
	case *redisStore:
		return &stores{memory: v.Local, redis: v, blocks: v.Blocks}
	case *stores:
		return v
	}

	panic(fmt.Sprintf("storeOf(%T)", s))
}
