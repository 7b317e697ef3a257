package tierlimit

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/config"
	"github.com/tierlimit/tierlimit/memstore"
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

func TestWindowResetsAtFirstHitPlusDuration(t *testing.T) {
	s := memstore.NewWindowStore(100)
	l := testLayer(s, "ip", 3, time.Second)
	first := t0 + int64(300*time.Millisecond)

	steps := []struct {
		at    int64
		count int64
		reset int64
	}{
		{first, 1, first + int64(time.Second)},
		{first + int64(500*time.Millisecond), 2, first + int64(time.Second)},
		{first + int64(999*time.Millisecond), 3, first + int64(time.Second)},
		{first + int64(time.Second) - 1, 4, first + int64(time.Second)},
		// The window ends exactly at first hit + duration, not on a clock boundary.
		{first + int64(time.Second), 1, first + int64(2*time.Second)},
		{first + int64(2500*time.Millisecond), 1, first + int64(3500*time.Millisecond)},
	}

	for i, st := range steps {
		got := hitOnce(s, st.at, l, "a")
		if got.count != st.count || got.reset != st.reset {
			t.Fatalf("step %d: count=%d reset=%d, want count=%d reset=%d", i, got.count, got.reset, st.count, st.reset)
		}
	}
}

func TestWindowExactCountAtBoundary(t *testing.T) {
	s := memstore.NewWindowStore(100)
	l := testLayer(s, "ip", 50, time.Second)

	for i := 1; i <= 52; i++ {
		got := hitOnce(s, t0+int64(i), l, "k")
		// A refused hit reports the count it would have reached, and is not counted.
		want := int64(i)
		if i > 51 {
			want = 51
		}

		if got.count != want {
			t.Fatalf("hit %d: count %d, want %d", i, got.count, want)
		}

		if stored := peekCount(s, t0+int64(i), "ip", "k"); stored != want && !(i > 50 && stored == 50) {
			t.Fatalf("hit %d: stored count %d", i, stored)
		}

		if refused := got.count > l.Points; refused != (i > 50) {
			t.Fatalf("hit %d: refused=%v", i, refused)
		}

		// The refusal is reported once per window.
		if got.firstRefusal != (i == 51) {
			t.Fatalf("hit %d: firstRefusal=%v", i, got.firstRefusal)
		}
	}

	// Next window: reported again.
	next := t0 + int64(2*time.Second)
	for i := 1; i <= 51; i++ {
		got := hitOnce(s, next, l, "k")
		if got.firstRefusal != (i == 51) {
			t.Fatalf("second window hit %d: firstRefusal=%v", i, got.firstRefusal)
		}
	}
}

func TestWindowKeysAndLayersAreSeparate(t *testing.T) {
	s := memstore.NewWindowStore(100)
	a := testLayer(s, "a", 1, time.Second)
	b := testLayer(s, "b", 1, time.Second)

	for _, c := range []struct {
		l   *layer
		key string
	}{{a, "x"}, {a, "y"}, {b, "x"}} {
		if got := hitOnce(s, t0, c.l, c.key); got.count != 1 {
			t.Fatalf("%s/%s: count %d, want 1", c.l.Name, c.key, got.count)
		}
	}
}

func TestTakeStopsAtRefusingLayer(t *testing.T) {
	s := memstore.NewWindowStore(100)
	g := newLayer(s, config.Rule{Name: "global", Points: 10, Duration: time.Second}, keyOfConst)
	ip := testLayer(s, "ip", 1, time.Second)
	route := testLayer(s, "login", 10, time.Second)
	layers := []*layer{g, ip, route}

	if tl := takeIn(s, t0, layers, "1.2.3.4", "", false); tl.Refused || tl.Shown != 1 || tl.Count != 1 || peekCount(s, t0, "login", "1.2.3.4") != 1 {
		t.Fatalf("first request: %+v, want every layer charged, ip shown (fewest left)", tl)
	}

	tl := takeIn(s, t0, layers, "1.2.3.4", "", false)
	if !tl.Refused || tl.Shown != 1 || tl.Count != 2 || tl.Firsts != 1<<1 {
		t.Fatalf("refused request: %+v, want ip shown with the count it would have reached", tl)
	}

	// A refused request changes no layer's count: not the route after ip,
	// not global before it, not ip itself.
	for _, c := range []struct{ layer, key string }{{"login", "1.2.3.4"}, {"global", "global"}, {"ip", "1.2.3.4"}} {
		if got := peekCount(s, t0, c.layer, c.key); got != 1 {
			t.Fatalf("%s count %d after a refusal, want 1", c.layer, got)
		}
	}

	// A refusal by the last layer gives back every earlier one.
	route.Points = 1
	other := "5.6.7.8"
	takeIn(s, t0, layers, other, "", false)
	if tl := takeIn(s, t0, []*layer{g, route}, other, "", false); !tl.Refused || tl.Shown != 1 || peekCount(s, t0, "global", "global") != 2 {
		t.Fatalf("refused by the last layer: %+v, global %d, want 2", tl, peekCount(s, t0, "global", "global"))
	}
	route.Points = 10

	// all=true (dry run) charges every layer; the refusing layer stays shown.
	if tl := takeIn(s, t0, layers, "1.2.3.4", "", true); tl.Shown != 1 || !tl.Refused || peekCount(s, t0, "login", "1.2.3.4") != 2 {
		t.Fatalf("dry run: %+v, route count %d, want every layer charged", tl, peekCount(s, t0, "login", "1.2.3.4"))
	}
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

func TestMaxTrackedPurgesExpiredThenEvictsOldest(t *testing.T) {
	s := memstore.NewWindowStore(3)
	short := testLayer(s, "short", 5, time.Second)
	long := testLayer(s, "long", 5, time.Minute)

	hitOnce(s, t0, long, "old")         // oldest start, long-lived
	hitOnce(s, t0+1, short, "expiring") // expires at t0+1s
	hitOnce(s, t0+2, long, "young")     // live
	later := t0 + int64(2*time.Second)  // "expiring" is now expired
	hitOnce(s, later, long, "new")      // at the cap: the expired one goes first

	if got := peekCount(s, later, "long", "old"); got != 1 {
		t.Fatalf("live key %q evicted while an expired one was held", "old")
	}

	if s.Count() != 3 {
		t.Fatalf("size %d, want 3", s.Count())
	}

	hitOnce(s, later+1, long, "newest") // no expired keys: the oldest start goes

	if got := peekCount(s, later+1, "long", "old"); got != 0 {
		t.Fatal("oldest key not evicted at the cap")
	}

	for _, k := range []string{"young", "new", "newest"} {
		if got := peekCount(s, later+1, "long", k); got != 1 {
			t.Fatalf("key %q lost", k)
		}
	}

	if s.Count() != 3 {
		t.Fatalf("size %d, want 3", s.Count())
	}
}

func TestMaxTrackedBoundsAFlood(t *testing.T) {
	s := memstore.NewWindowStore(1000)
	l := testLayer(s, "ip", 5, time.Minute)

	for i := 0; i < 100000; i++ {
		hitOnce(s, t0+int64(i), l, formatInt(int64(i)))
	}

	if s.Count() != 1000 {
		t.Fatalf("size %d after flood, want 1000", s.Count())
	}

	// The newest keys survive.
	if got := peekCount(s, t0+100000, "ip", "99999"); got != 1 {
		t.Fatal("newest key evicted")
	}
}

func TestExpiredKeysArePurgedBelowTheCap(t *testing.T) {
	s := memstore.NewWindowStore(1 << 20)
	l := testLayer(s, "ip", 5, time.Second)

	// Each second brings 100 new clients; the old ones expire.
	for sec := int64(0); sec < 50; sec++ {
		for i := int64(0); i < 100; i++ {
			hitOnce(s, t0+sec*int64(time.Second)+i, l, formatInt(sec*1000+i))
		}
	}

	if s.Count() > 300 {
		t.Fatalf("%d counters held for 100 live clients: expired ones are not purged", s.Count())
	}
}

func TestWindowCountsExactlyUnderConcurrency(t *testing.T) {
	s := memstore.NewWindowStore(100)
	l := testLayer(s, "ip", 1000, time.Hour)

	var wg sync.WaitGroup
	var mu sync.Mutex
	allowed := 0

	for g := 0; g < 8; g++ {
		wg.Add(1)

		go func() {
			defer wg.Done()

			for i := 0; i < 250; i++ {
				if got := hitOnce(s, t0, l, "k"); got.count <= l.Points {
					mu.Lock()
					allowed++
					mu.Unlock()
				}
			}
		}()
	}

	wg.Wait()

	if allowed != 1000 {
		t.Fatalf("allowed %d of 2000, want exactly 1000", allowed)
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

// At the cap, the counters a request charged are never the ones evicted: with
// room for one counter per layer, global and ip do not evict each other, and
// global counts every request.
func TestEvictionSparesTheCountersOfTheRequest(t *testing.T) {
	s := memstore.NewWindowStore(2)
	global := newLayer(s, config.Rule{Name: "global", Points: 5, Duration: time.Minute}, keyOfConst)
	ip := testLayer(s, "ip", 50, time.Minute)

	allowed := 0

	for i := 0; i < 10; i++ {
		got := takeIn(s, t0+int64(i), []*layer{global, ip}, "198.51.100."+formatInt(int64(i)), "", false)
		if !got.Refused {
			allowed++
		}

		if s.Count() > 2 {
			t.Fatalf("request %d: %d counters held, cap 2", i, s.Count())
		}
	}

	if allowed != 5 {
		t.Fatalf("%d of 10 allowed through global 5 at maxTracked 2: the layers evicted each other's counters", allowed)
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

// A sliding layer's counter is spared too.
func TestEvictionSparesASlidingCounterOfTheRequest(t *testing.T) {
	s := memstore.NewWindowStore(2)
	global := newLayer(s, config.Rule{Name: "global", Points: 5, Duration: time.Minute, Sliding: true}, keyOfConst)
	ip := testLayer(s, "ip", 50, time.Minute)

	allowed := 0

	for i := 0; i < 10; i++ {
		if got := takeIn(s, t0+int64(i), []*layer{global, ip}, "198.51.100."+formatInt(int64(i)), "", false); !got.Refused {
			allowed++
		}
	}

	if allowed != 5 {
		t.Fatalf("%d of 10 allowed through sliding global 5 at maxTracked 2", allowed)
	}
}

// TestEvictionKeepsLimitedKeys: at maxTracked, a client over its limit is
// not evicted by others filling the table, on the fast and the general
// path; a key over its limit goes only when every key is; evictions count.
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

	// Every key limited: the oldest goes.
	s := memstore.NewWindowStore(2)
	l := testLayer(s, "ip", 1, time.Minute)
	for _, k := range []string{"a", "a", "b", "b"} {
		hitOnce(s, t0, l, k)
	}

	hitOnce(s, t0, l, "c")

	if peekCount(s, t0, "ip", "a") != 0 || peekCount(s, t0, "ip", "b") != 1 || s.Evicted() != 1 {
		t.Fatalf("all limited: a %d, b %d, evictions %d; want a evicted", peekCount(s, t0, "ip", "a"), peekCount(s, t0, "ip", "b"), s.Evicted())
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
