package tierlimit

import (
	"bufio"
	"net"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/redisresp"
	"github.com/tierlimit/tierlimit/redisstore"
)

// Synced counting (redis.syncInterval) at its edges: charges made
// while a failing sync is in flight, a key at its points under maxTracked
// pressure, a request at the instant its window ends.

// hangingRedis accepts connections and reads what they send without
// answering, until release, then closes them: a Redis that fails a call
// after the call was sent. got receives once, at the first bytes read.
type hangingRedis struct {
	l       net.Listener
	got     chan struct{}
	release chan struct{}
}

func newHangingRedis(t *testing.T) *hangingRedis {
	t.Helper()

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}

	s := &hangingRedis{l: l, got: make(chan struct{}, 1), release: make(chan struct{})}
	t.Cleanup(func() { l.Close() })

	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}

			go func() {
				defer c.Close()

				if _, err := bufio.NewReader(c).ReadByte(); err != nil {
					return
				}

				select {
				case s.got <- struct{}{}:
				default:
				}

				<-s.release
			}()
		}
	}()

	return s
}

// TestChargesDuringAFailingSyncAreKept: points charged while a sync is in
// flight are added to what that sync puts back when it fails, not replaced
// by it; the next sync that works sends them all.
func TestChargesDuringAFailingSyncAreKept(t *testing.T) {
	addr, admin := redisServer(t)
	h, st, _ := syncHarness(t, addr, nil)
	client := "203.0.113.30"

	take := func(n int) {
		t.Helper()

		for i := 0; i < n; i++ {
			if !takeOn(st, h, client) {
				t.Fatalf("a request of the first 10 refused")
			}
		}
	}

	take(6)
	mustSync(t, st, h.clock.Now().UnixNano()) // Redis 6
	take(2)

	// A sync sends the 2 to a Redis that hangs, then drops the connection;
	// 2 more are charged meanwhile.
	hang := newHangingRedis(t)
	good := st.Backend.Pool
	down := redisresp.NewPool(redisresp.Options{Address: hang.l.Addr().String(), Timeout: 5 * time.Second})
	t.Cleanup(down.Close)
	st.Backend.Pool = down

	failed := make(chan error, 1)
	go func() { failed <- redisstore.SyncNow(st, h.clock.Now().UnixNano()) }()

	<-hang.got
	take(2)
	close(hang.release)

	if err := <-failed; err == nil {
		t.Fatal("a sync on a dropped connection succeeded")
	}

	if c := counterOf(st, "ip", client); c.Remote != 6 || c.Pending != 4 || c.Inflight != 0 {
		t.Fatalf("after the failed sync: remote %d, pending %d, inflight %d; want 6, 4 (the sync's 2 and the 2 charged during it), 0",
			c.Remote, c.Pending, c.Inflight)
	}

	// Redis answers again: the probe after the back-off sends the 4.
	st.Backend.Pool = good
	h.clock.Add(time.Second)
	mustSync(t, st, h.clock.Now().UnixNano())

	ip := h.p.layers[layerIndex(h, "ip")]
	start, _ := redisstore.SyncWindow(ip, h.clock.Now().UnixNano())
	if got := redisDo(t, admin, "GET", redisstore.SyncKey(ip, client, false, start)).Str; got != "10" {
		t.Fatalf("Redis total %q after the recovery, want 10: every charge once", got)
	}

	if takeOn(st, h, client) {
		t.Fatal("an 11th request allowed")
	}
}

// TestSyncedKeyAtItsPointsIsNotEvicted: at maxTracked, a synced key that
// Redis counts at exactly its points, within its window, is not dropped to
// make room: dropped, its next request would start from nothing here and
// be given its points again until the next sync.
func TestSyncedKeyAtItsPointsIsNotEvicted(t *testing.T) {
	addr, _ := redisServer(t)
	h, st, _ := syncHarness(t, addr, func(c *Config) { c.MaxTracked = 4 })
	full := "203.0.113.31"

	for i := 0; i < 10; i++ {
		if !takeOn(st, h, full) {
			t.Fatalf("request %d of 10 refused", i+1)
		}
	}

	mustSync(t, st, h.clock.Now().UnixNano())

	if c := counterOf(st, "ip", full); c == nil || c.Remote != 10 || c.Pending != 0 || c.Logged {
		t.Fatalf("the full key after its sync: %+v, want remote 10, nothing pending, no refusal yet", c)
	}

	// New keys, each charged once (pending), fill the table and ask for
	// room: the full key is the only one with nothing to send.
	for _, client := range []string{"203.0.113.32", "203.0.113.33", "203.0.113.34", "203.0.113.36"} {
		takeOn(st, h, client)
	}

	if takeOn(st, h, full) {
		t.Fatal("the key at its 10 points was allowed again after maxTracked pressure")
	}
}

// TestSyncedKeyAtItsWindowsEnd: the instant a synced key's window ends
// (now == its end) belongs to the next window, as in the memory store (a
// window expires when its expiry <= now) and the Lua scripts (a key whose
// PTTL is 0 is not live): the request is allowed and counted under the
// next window's key, and the ended window's key keeps its count.
func TestSyncedKeyAtItsWindowsEnd(t *testing.T) {
	addr, admin := redisServer(t)
	h, st, _ := syncHarness(t, addr, nil)
	client := "203.0.113.35"
	ip := h.p.layers[layerIndex(h, "ip")]

	for i := 0; i < 11; i++ {
		takeOn(st, h, client)
	}

	mustSync(t, st, h.clock.Now().UnixNano())

	// The harness's clock is 10:00:00.2; the window is 10:00 to 10:01.
	end := time.Date(2026, 6, 15, 10, 1, 0, 0, time.UTC)
	h.clock.Add(end.Sub(h.clock.Now()))
	now := h.clock.Now().UnixNano()

	if c := counterOf(st, "ip", client); c.End != now {
		t.Fatalf("the counter's window ends at %d, the clock is at %d", c.End, now)
	}

	if !takeOn(st, h, client) {
		t.Fatal("a request at the instant its window ended was refused: it belongs to the next window")
	}

	mustSync(t, st, now)

	prev := redisstore.SyncKey(ip, client, false, end.Add(-time.Minute).UnixNano())
	next := redisstore.SyncKey(ip, client, false, end.UnixNano())

	if got := redisDo(t, admin, "GET", next).Str; got != "1" {
		t.Fatalf("the next window's total %q, want 1", got)
	}

	if got := redisDo(t, admin, "GET", prev).Str; got != "10" {
		t.Fatalf("the ended window's total %q, want its 10", got)
	}

	// The memory store draws the same line: a window that started at the
	// first request ends at start + duration, and a request then starts
	// the next.
	m := newHarness(t, func(c *Config) {
		c.Global.Points = 0
		c.IP = LayerConfig{Points: 1, Duration: "60s"}
	})
	m.get("/api", client+":1")

	if code := m.get("/api", client+":1").Code; code != 429 {
		t.Fatalf("memory store: a second request of 1 point: %d", code)
	}

	m.clock.Add(time.Minute)

	if code := m.get("/api", client+":1").Code; code != 200 {
		t.Fatalf("memory store: a request at the instant its window ended: %d, want 200", code)
	}
}
