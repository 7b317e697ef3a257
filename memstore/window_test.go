package memstore

import (
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/config"
	"github.com/tierlimit/tierlimit/limit"
	"github.com/tierlimit/tierlimit/rule"
)

var t0 = time.Date(2026, 6, 15, 10, 0, 0, 0, time.UTC).UnixNano()

// newLayer is the layer the root builds from spec (its newLayer), as far as
// the memory store reads it: rule.NewLayer, attached to s.
func newLayer(s *WindowStore, spec config.Rule, keyKind int) *rule.Layer {
	l := rule.NewLayer(spec, keyKind)
	s.Attach(l)

	return l
}

func testLayer(s *WindowStore, name string, points int64, d time.Duration) *rule.Layer {
	return newLayer(s, config.Rule{Name: name, Points: points, Duration: d}, rule.KeyOfClient)
}

// hit is one layer's outcome of a request.
type hit struct {
	count, reset int64
	firstRefusal bool
}

func hitOnce(s *WindowStore, now int64, l *rule.Layer, key string) hit {
	t := takeIn(s, now, []*rule.Layer{l}, key, false)

	return hit{count: t.Count, reset: t.Reset, firstRefusal: t.Firsts != 0}
}

// takeIn charges layers to client as the root's take does for a memory
// store (with its blocks when a layer blocks), and returns the tally.
func takeIn(s *WindowStore, now int64, layers []*rule.Layer, client string, all bool) rule.Tally {
	var t rule.Tally

	blocks := false
	for _, l := range layers {
		blocks = blocks || l.BlockDuration != 0
	}

	keys := make([]string, len(layers))
	for i, l := range layers {
		keys[i] = client
		if l.KeyKind == rule.KeyOfConst {
			keys[i] = l.ConstKey
		}
	}

	TakeWithBlocks(s, blocks, &t, &rule.Charge{Layers: layers, Keys: keys, Client: client, Now: now, All: all})

	return t
}

func peekCount(s *WindowStore, now int64, layer, key string) int64 {
	count, _ := s.Peek(now, layer, key)
	return count
}

func formatInt(n int64) string { return strconv.FormatInt(n, 10) }

func TestWindowResetsAtFirstHitPlusDuration(t *testing.T) {
	s := NewWindowStore(100)
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
	s := NewWindowStore(100)
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

		if refused := got.count > l.Capacity; refused != (i > 50) {
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
	s := NewWindowStore(100)
	a := testLayer(s, "a", 1, time.Second)
	b := testLayer(s, "b", 1, time.Second)

	for _, c := range []struct {
		l   *rule.Layer
		key string
	}{{a, "x"}, {a, "y"}, {b, "x"}} {
		if got := hitOnce(s, t0, c.l, c.key); got.count != 1 {
			t.Fatalf("%s/%s: count %d, want 1", c.l.Name, c.key, got.count)
		}
	}
}

func TestTakeStopsAtRefusingLayer(t *testing.T) {
	s := NewWindowStore(100)
	g := newLayer(s, config.Rule{Name: "global", Points: 10, Duration: time.Second}, rule.KeyOfConst)
	ip := testLayer(s, "ip", 1, time.Second)
	route := testLayer(s, "login", 10, time.Second)
	layers := []*rule.Layer{g, ip, route}

	if tl := takeIn(s, t0, layers, "1.2.3.4", false); tl.Refused || tl.Shown != 1 || tl.Count != 1 || peekCount(s, t0, "login", "1.2.3.4") != 1 {
		t.Fatalf("first request: %+v, want every layer charged, ip shown (fewest left)", tl)
	}

	tl := takeIn(s, t0, layers, "1.2.3.4", false)
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
	route.Capacity = 1
	other := "5.6.7.8"
	takeIn(s, t0, layers, other, false)
	if tl := takeIn(s, t0, []*rule.Layer{g, route}, other, false); !tl.Refused || tl.Shown != 1 || peekCount(s, t0, "global", "global") != 2 {
		t.Fatalf("refused by the last layer: %+v, global %d, want 2", tl, peekCount(s, t0, "global", "global"))
	}
	route.Capacity = 10

	// all=true (dry run) charges every layer; the refusing layer stays shown.
	if tl := takeIn(s, t0, layers, "1.2.3.4", true); tl.Shown != 1 || !tl.Refused || peekCount(s, t0, "login", "1.2.3.4") != 2 {
		t.Fatalf("dry run: %+v, route count %d, want every layer charged", tl, peekCount(s, t0, "login", "1.2.3.4"))
	}
}

func TestMaxTrackedPurgesExpiredThenEvictsOldest(t *testing.T) {
	s := NewWindowStore(3)
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
	s := NewWindowStore(1000)
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
	s := NewWindowStore(1 << 20)
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
	s := NewWindowStore(100)
	l := testLayer(s, "ip", 1000, time.Hour)

	var wg sync.WaitGroup
	var mu sync.Mutex
	allowed := 0

	for g := 0; g < 8; g++ {
		wg.Add(1)

		go func() {
			defer wg.Done()

			for i := 0; i < 250; i++ {
				if got := hitOnce(s, t0, l, "k"); got.count <= l.Capacity {
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

// At the cap, the counters a request charged are never the ones evicted: with
// room for one counter per layer, global and ip do not evict each other, and
// global counts every request.
func TestEvictionSparesTheCountersOfTheRequest(t *testing.T) {
	s := NewWindowStore(2)
	global := newLayer(s, config.Rule{Name: "global", Points: 5, Duration: time.Minute}, rule.KeyOfConst)
	ip := testLayer(s, "ip", 50, time.Minute)

	allowed := 0

	for i := 0; i < 10; i++ {
		got := takeIn(s, t0+int64(i), []*rule.Layer{global, ip}, "198.51.100."+formatInt(int64(i)), false)
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

// A sliding layer's counter is spared too.
func TestEvictionSparesASlidingCounterOfTheRequest(t *testing.T) {
	s := NewWindowStore(2)
	global := newLayer(s, config.Rule{Name: "global", Points: 5, Duration: time.Minute, Algorithm: limit.Sliding}, rule.KeyOfConst)
	ip := testLayer(s, "ip", 50, time.Minute)

	allowed := 0

	for i := 0; i < 10; i++ {
		if got := takeIn(s, t0+int64(i), []*rule.Layer{global, ip}, "198.51.100."+formatInt(int64(i)), false); !got.Refused {
			allowed++
		}
	}

	if allowed != 5 {
		t.Fatalf("%d of 10 allowed through sliding global 5 at maxTracked 2", allowed)
	}
}

// TestSlidingRemovesTheBoundaryBurst spends a layer's points at the end of one
// window and again at the start of the next: a fixed window lets both bursts
// through, a sliding one refuses most of the second.
func TestSlidingRemovesTheBoundaryBurst(t *testing.T) {
	for _, sliding := range []bool{false, true} {
		alg := limit.Fixed
		if sliding {
			alg = limit.Sliding
		}

		s := NewWindowStore(100)
		l := newLayer(s, config.Rule{Name: "ip", Points: 10, Duration: 10 * time.Second, Algorithm: alg}, rule.KeyOfClient)
		start := time.Unix(1000, 0).UnixNano()

		burst := func(at int64, n int) (allowed int, last rule.Tally) {
			for i := 0; i < n; i++ {
				tl := takeIn(s, at, []*rule.Layer{l}, "203.0.113.1", false)

				if !tl.Refused {
					allowed++
				}

				last = tl
			}

			return allowed, last
		}

		// The first hit opens the window at start; nine more at its very end.
		burst(start, 1)

		if got, _ := burst(start+int64(9900*time.Millisecond), 9); got != 9 {
			t.Fatalf("sliding %v: end of the first window: %d of 9 allowed", sliding, got)
		}

		got, last := burst(start+int64(10100*time.Millisecond), 10)

		if !sliding {
			if got != 10 {
				t.Fatalf("fixed: %d of the second burst allowed, want 10", got)
			}

			continue
		}

		// 10 x 9.9s/10s of the previous window still weigh 9: one more fits.
		if got != 1 {
			t.Fatalf("sliding: %d of the second burst allowed, want 1", got)
		}

		if !last.Refused || last.Count != 11 {
			t.Fatalf("sliding: last request %+v, want refused with estimate 11", last)
		}

		// The refusal's reset is when the next request fits: then one is
		// allowed, and not a millisecond earlier.
		wait := last.Reset

		if n, _ := burst(wait-int64(time.Millisecond), 1); n != 0 {
			t.Fatalf("sliding: allowed before the reported reset")
		}

		if n, _ := burst(wait, 1); n != 1 {
			t.Fatalf("sliding: refused at the reported reset")
		}
	}
}

// TestSlidingCountsOnlyAllowedRequests: a client that keeps retrying above the
// limit is let through again once the window has slid, because its refusals
// did not count, and no faster than the previous window's weight allows.
func TestSlidingCountsOnlyAllowedRequests(t *testing.T) {
	s := NewWindowStore(100)
	l := newLayer(s, config.Rule{Name: "ip", Points: 5, Duration: time.Second, Algorithm: limit.Sliding}, rule.KeyOfClient)
	now := time.Unix(2000, 0).UnixNano()

	var allowed []int // milliseconds after the first request

	// 100 requests per window, for 10 windows, evenly spread.
	for i := 0; i < 1000; i++ {
		tl := takeIn(s, now+int64(i)*int64(10*time.Millisecond), []*rule.Layer{l}, "c", false)

		if !tl.Refused {
			allowed = append(allowed, i*10)
		}
	}

	// The first window allows its first 5 requests. In each later one the
	// previous window's 5 weigh 5 x left / 1s, so the n-th request (from 0)
	// fits once that weight is down to 4 - n: after 10, 210, ... 810 ms.
	want := []int{0, 10, 20, 30, 40}
	for w := 1; w < 10; w++ {
		for n := 0; n < 5; n++ {
			want = append(want, w*1000+10+n*200)
		}
	}

	if len(allowed) != len(want) {
		t.Fatalf("%d of 1000 allowed over 10 windows of 5 points, want %d: at %v ms", len(allowed), len(want), allowed)
	}

	for i := range want {
		if allowed[i] != want[i] {
			t.Fatalf("allowed at %v ms, want %v", allowed, want)
		}
	}
}

// TestSlidingExpiresAfterTwoWindows: a sliding counter is kept one window past
// its end, since it weighs on the next, and dropped after.
func TestSlidingExpiresAfterTwoWindows(t *testing.T) {
	s := NewWindowStore(100)
	l := newLayer(s, config.Rule{Name: "ip", Points: 3, Duration: time.Second, Algorithm: limit.Sliding}, rule.KeyOfClient)
	f := newLayer(s, config.Rule{Name: "f", Points: 3, Duration: time.Second}, rule.KeyOfClient)
	now := time.Unix(3000, 0).UnixNano()

	takeIn(s, now, []*rule.Layer{l, f}, "a", false)

	if l.List == f.List {
		t.Fatal("a sliding and a fixed layer of one duration share a list")
	}

	// A new key after 1.5 windows purges the fixed counter, not the sliding one.
	takeIn(s, now+int64(1500*time.Millisecond), []*rule.Layer{f}, "b", false)
	takeIn(s, now+int64(1500*time.Millisecond), []*rule.Layer{l}, "b", false)

	if _, ok := l.Entries["a"]; !ok {
		t.Fatal("sliding counter dropped within its second window")
	}

	if _, ok := f.Entries["a"]; ok {
		t.Fatal("expired fixed counter kept")
	}

	takeIn(s, now+int64(2500*time.Millisecond), []*rule.Layer{l}, "c", false)

	if _, ok := l.Entries["a"]; ok {
		t.Fatal("sliding counter kept past two windows")
	}
}

// TestEvictionTakesTheOldestWhenEveryKeyIsLimited: a key over its limit goes
// only when every key is (the root's TestEvictionKeepsLimitedKeys: not
// before); evictions count.
func TestEvictionTakesTheOldestWhenEveryKeyIsLimited(t *testing.T) {
	s := NewWindowStore(2)
	l := testLayer(s, "ip", 1, time.Minute)
	for _, k := range []string{"a", "a", "b", "b"} {
		hitOnce(s, t0, l, k)
	}

	hitOnce(s, t0, l, "c")

	if peekCount(s, t0, "ip", "a") != 0 || peekCount(s, t0, "ip", "b") != 1 || s.Evicted() != 1 {
		t.Fatalf("all limited: a %d, b %d, evictions %d; want a evicted", peekCount(s, t0, "ip", "a"), peekCount(s, t0, "ip", "b"), s.Evicted())
	}
}
