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

// TestAFailingSyncKeepsTheLeaseItWasGivingBack: a sync that gives an idle
// key's lease back and fails leaves the lease held; a request of that key
// during the sync waits for it (the points are Redis's only once the call
// ends) and is then admitted from the lease.
func TestAFailingSyncKeepsTheLeaseItWasGivingBack(t *testing.T) {
	addr, admin := redisServer(t)
	h, st, _ := syncHarness(t, addr, nil)
	client := "203.0.113.30"

	// A lease of 3 (a quarter of 10, rounded up), one spent; then a sync
	// with the key asked for, which sends nothing.
	if !takeOn(st, h, client) {
		t.Fatal("the first request was refused")
	}

	mustSync(t, st, h.clock.Now().UnixNano())

	// The next sync gives the idle key's 2 back, to a Redis that hangs,
	// then drops the connection.
	hang := newHangingRedis(t)
	good := st.Backend.Pool
	down := redisresp.NewPool(redisresp.Options{Address: hang.l.Addr().String(), Timeout: 5 * time.Second})
	t.Cleanup(down.Close)
	st.Backend.Pool = down

	failed := make(chan error, 1)
	go func() { failed <- redisstore.SyncNow(st, h.clock.Now().UnixNano(), false) }()

	<-hang.got

	allowed := make(chan bool, 1)
	go func() { allowed <- takeOn(st, h, client) }()

	close(hang.release)

	if err := <-failed; err == nil {
		t.Fatal("a sync on a dropped connection succeeded")
	}

	if !<-allowed {
		t.Fatal("the request that waited for the failed sync was refused")
	}

	if c := counterOf(st, "ip", client); c.Lease != 1 || c.Back != 0 || c.Pending != 0 || redisstore.Counted(c) != 2 {
		t.Fatalf("after the failed sync: %+v; want the lease of 2 held again, 1 of it spent", c)
	}

	// Redis answers again: the last sync gives the lease back.
	st.Backend.Pool = good
	h.clock.Add(time.Second)

	if err := redisstore.SyncNow(st, h.clock.Now().UnixNano(), true); err != nil {
		t.Fatal(err)
	}

	ip := h.p.layers[layerIndex(h, "ip")]
	start, _ := redisstore.SyncWindow(ip, h.clock.Now().UnixNano())
	if got := redisDo(t, admin, "GET", redisstore.SyncKey(ip, client, false, start)).Str; got != "2" {
		t.Fatalf("Redis total %q after the recovery, want the 2 admitted", got)
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

	// Every lease back: Redis counts what was admitted.
	if err := redisstore.SyncNow(st, now, true); err != nil {
		t.Fatal(err)
	}

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
