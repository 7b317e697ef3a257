package tierlimit

import (
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/redisstore"
)

// Leases of synced counters (redis.syncInterval) between replicas: what
// goes back, what a dead replica takes with it, and the script's grant.

// allowedOf sends n requests of client, taking turns over replicas, and
// returns how many were allowed.
func allowedOf(h *harness, client string, n int, replicas ...*syncState) int {
	allowed := 0

	for i := 0; i < n; i++ {
		if takeOn(replicas[i%len(replicas)], h, client) {
			allowed++
		}
	}

	return allowed
}

// TestIdleLeaseGoesBackToTheOtherReplicas: a key that no request asked for
// during a sync gives its lease back at the next, and another replica can
// then spend those points: b gets the 9 points a does not use.
func TestIdleLeaseGoesBackToTheOtherReplicas(t *testing.T) {
	addr, admin := redisServer(t)
	h, a, _ := syncHarness(t, addr, nil)
	b := replica(a)
	client := "203.0.113.60"

	if !takeOn(a, h, client) {
		t.Fatal("a's request was refused")
	}

	now := h.clock.Now().UnixNano()
	mustSync(t, a, now) // asked for since the last sync: keeps its lease
	if c := counterOf(a, "ip", client); c.Lease != 2 {
		t.Fatalf("a's lease %d after a sync with the key in use, want 2", c.Lease)
	}

	mustSync(t, a, now) // idle: the 2 go back

	ip := h.p.layers[layerIndex(h, "ip")]
	start, _ := redisstore.SyncWindow(ip, now)
	if got := redisDo(t, admin, "GET", redisstore.SyncKey(ip, client, false, start)).Str; got != "1" {
		t.Fatalf("Redis holds %q after a gave its lease back, want the 1 it spent", got)
	}

	allowed := allowedOf(h, client, 12, b)

	if allowed != 9 {
		t.Fatalf("b allowed %d, want the 9 that a did not spend", allowed)
	}
}

// TestADeadReplicasLeaseIsLostUntilTheWindowEnds: a replica that stops
// holding a lease (killed: nothing gives it back) takes its points with it
// until the window ends; the others then admit the points minus that lease,
// never more, and the next window starts whole.
func TestADeadReplicasLeaseIsLostUntilTheWindowEnds(t *testing.T) {
	addr, _ := redisServer(t)
	h, a, _ := syncHarness(t, addr, nil)
	b := replica(a)
	client := "203.0.113.61"

	// a leases 3 of the 10, spends 1, and dies with 2.
	if !takeOn(a, h, client) {
		t.Fatal("a's request was refused")
	}

	allowed := allowedOf(h, client, 12, b)

	if allowed != 7 {
		t.Fatalf("b allowed %d beside a's lease of 3, want 7: a's 2 unspent points are lost until the window ends", allowed)
	}

	h.clock.Add(time.Minute)

	allowed = allowedOf(h, client, 12, b)

	if allowed != 10 {
		t.Fatalf("b allowed %d in the next window, want its 10", allowed)
	}
}

// TestARefusingReplicaLearnsOfPointsGivenBack: a replica that refuses a key
// for want of room (from its refusal cache, on the anonymous fast path)
// asks again at its next sync, and admits the points another replica gave
// back, then refuses again.
func TestARefusingReplicaLearnsOfPointsGivenBack(t *testing.T) {
	addr, _ := redisServer(t)
	h, a, _ := syncHarness(t, addr, func(c *Config) { c.Global.Points = 0 })
	b := replica(a)
	client := "203.0.113.62"

	if !takeOn(b, h, client) {
		t.Fatal("b's request was refused")
	}

	for i := 1; i <= 9; i++ {
		want := http.StatusOK
		if i > 7 {
			want = http.StatusTooManyRequests // the second from the cache
		}

		if code := h.get("/api", client+":1").Code; code != want {
			t.Fatalf("request %d beside b's lease of 3: %d, want %d", i, code, want)
		}
	}

	now := h.clock.Now().UnixNano()
	mustSync(t, b, now)
	mustSync(t, b, now) // b's key idle: its 2 go back
	mustSync(t, a, now) // a asks again

	// The sync leased 1 of the 2 (a quarter, rounded up); the next request
	// asks for the other.
	for i, want := range []int{http.StatusOK, http.StatusOK, http.StatusTooManyRequests} {
		if code := h.get("/api", client+":1").Code; code != want {
			t.Fatalf("request %d after b gave 2 points back: %d, want %d", i+1, code, want)
		}
	}
}

// TestConcurrentReplicasNeverOverAdmit: two replicas, eight goroutines
// each, one key of 50 points and 800 requests: exactly 50 allowed, each
// from a lease, while requests wait for the lease calls of others (the
// race detector runs it in make test).
func TestConcurrentReplicasNeverOverAdmit(t *testing.T) {
	addr, admin := redisServer(t)
	h, a, _ := syncHarness(t, addr, func(c *Config) { c.IP = LayerConfig{Points: 50, Duration: "60s"} })
	b := replica(a)
	client := "203.0.113.63"

	var allowed atomic.Int64
	var wg sync.WaitGroup

	for g := 0; g < 16; g++ {
		st := a
		if g%2 == 1 {
			st = b
		}

		wg.Add(1)

		go func(st *syncState) {
			defer wg.Done()

			for i := 0; i < 50; i++ {
				if takeOn(st, h, client) {
					allowed.Add(1)
				}
			}
		}(st)
	}

	wg.Wait()

	if allowed.Load() != 50 {
		t.Fatalf("16 goroutines over two replicas allowed %d, want the 50 points", allowed.Load())
	}

	ip := h.p.layers[layerIndex(h, "ip")]
	start, _ := redisstore.SyncWindow(ip, h.clock.Now().UnixNano())
	if got := redisDo(t, admin, "GET", redisstore.SyncKey(ip, client, false, start)).Str; got != "50" {
		t.Fatalf("Redis granted %q, want 50", got)
	}
}
