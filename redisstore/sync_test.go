package redisstore

// Synced counters (redis.syncInterval) on a real redis-server: leases
// between replicas, what goes back, what a dead replica takes with it,
// syncs that fail or panic, releases, and a Cluster's batches.

import (
	"bufio"
	"bytes"
	"errors"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/config"
	"github.com/tierlimit/tierlimit/redisresp"
	"github.com/tierlimit/tierlimit/rule"
)

// syncHarness is newStoreHarness with redis.syncInterval: its synced counters
// use the harness's backend and clock, and an interval long enough that the
// goroutine never syncs during the test (the tests call syncNow).
func syncHarness(t *testing.T, addr string, mutate func(c *config.Config)) (*storeHarness, *SyncState, *bytes.Buffer) {
	t.Helper()

	h, logs := newStoreHarness(t, addr, func(c *config.Config) {
		c.Redis.SyncInterval = "1h"
		c.IP = config.LayerConfig{Points: 10, Duration: "60s"}
		if mutate != nil {
			mutate(c)
		}
	})

	rs := h.store
	st := rs.Synced
	if st == nil {
		t.Fatal("redis.syncInterval made no synced store")
	}

	st.Mu.Lock()
	st.Backend, st.Now = rs.Backend, h.clock.Now
	st.Mu.Unlock()

	return h, st, logs
}

// otherReplica is another Traefik process's synced counters on the same backend.
func otherReplica(st *SyncState) *SyncState {
	r := NewSyncState()
	r.Max, r.Backend, r.Interval, r.Now, r.Started = 1000, st.Backend, time.Hour, st.Now, true

	return r
}

// counterOf is st's counter of bucket in the layer called layer, or nil.
func counterOf(st *SyncState, layer, bucket string) *SyncCounter {
	st.Mu.Lock()
	defer st.Mu.Unlock()

	return st.ByLayer[layer][bucket]
}

// takeOn decides one request of client on st, as the request path does for
// an anonymous request (global if on, then ip: the harness's layers), and
// reports whether it was allowed.
func takeOn(st *SyncState, h *storeHarness, client string) bool {
	var tl rule.Tally
	SyncTake(st, &tl, h.charge(client, h.clock.Now().UnixNano()))

	return !tl.Refused
}

func mustSync(t *testing.T, st *SyncState, now int64) {
	t.Helper()

	if err := SyncNow(st, now, false); err != nil {
		t.Fatalf("sync: %v", err)
	}
}

// allowedOf sends n requests of client, taking turns over replicas, and
// returns how many were allowed.
func allowedOf(h *storeHarness, client string, n int, replicas ...*SyncState) int {
	allowed := 0

	for i := 0; i < n; i++ {
		if takeOn(replicas[i%len(replicas)], h, client) {
			allowed++
		}
	}

	return allowed
}

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

// TestSyncedReplicasNeverAdmitMoreThanThePoints: two replicas taking
// turns on one client's key admit its 10 points between them, no more, each
// from leases Redis granted (a quarter of what was left, rounded up, down to
// one point), and Redis counts every point granted. The next window starts
// from nothing, here and in Redis.
func TestSyncedReplicasNeverAdmitMoreThanThePoints(t *testing.T) {
	addr, admin := startRedis(t)
	h, a, _ := syncHarness(t, addr, nil)
	b := otherReplica(a)
	client := "203.0.113.9"

	// The window is aligned to the epoch: 10:00:00 to 10:01:00.
	ip := h.layer("ip")
	key := ip.RedisKey + client + ":" + formatInt(time.Date(2026, 6, 15, 10, 0, 0, 0, time.UTC).UnixMilli())

	allowed := allowedOf(h, client, 30, a, b)

	if allowed != 10 {
		t.Fatalf("two replicas allowed %d of 30 requests, want ip's 10", allowed)
	}

	if got := redisDo(t, admin, "GET", key).Str; got != "10" {
		t.Fatalf("Redis total %q, want the 10 points granted", got)
	}

	if ttl := redisDo(t, admin, "PTTL", key).Int; ttl <= 0 || ttl > 60000+int64(KeyGrace/time.Millisecond) {
		t.Fatalf("synced key's TTL %d ms, want the window's rest (+ grace)", ttl)
	}

	for name, st := range map[string]*SyncState{"a": a, "b": b} {
		if c := counterOf(st, "ip", client); c.Lease != 0 || c.Remote != 10 {
			t.Fatalf("replica %s: lease %d, remote %d; want 0 and 10", name, c.Lease, c.Remote)
		}
	}

	// The next window: a's first request leases ceil(10/4) = 3 points.
	h.clock.Add(time.Minute)

	if !takeOn(a, h, client) {
		t.Fatal("the next window's first request was refused")
	}

	next := ip.RedisKey + client + ":" + formatInt(time.Date(2026, 6, 15, 10, 1, 0, 0, time.UTC).UnixMilli())
	if got := redisDo(t, admin, "GET", next).Str; got != "3" {
		t.Fatalf("new window's total %q, want the lease of 3", got)
	}

	if a.Size != 1 {
		t.Fatalf("a holds %d counters, want 1", a.Size)
	}

	if c := counterOf(a, "ip", client); c == nil || c.Key != next || c.Lease != 2 || Counted(c) != 1 {
		t.Fatalf("a's counter of the new window: %+v, want a lease of 2 left and 1 counted", c)
	}
}

func TestSyncRefusedRequestChargesNoLayer(t *testing.T) {
	addr, admin := startRedis(t)
	h, st, _ := syncHarness(t, addr, func(c *config.Config) {
		c.Global = config.LayerConfig{Points: 100, Duration: "60s"}
		c.IP = config.LayerConfig{Points: 2, Duration: "60s"}
	})

	for i := 0; i < 5; i++ {
		takeOn(st, h, "203.0.113.9")
	}

	// Every lease back: Redis counts what was admitted.
	if err := SyncNow(st, h.clock.Now().UnixNano(), true); err != nil {
		t.Fatal(err)
	}

	g := h.layer("global")
	start := formatInt(time.Date(2026, 6, 15, 10, 0, 0, 0, time.UTC).UnixMilli())
	if got := redisDo(t, admin, "GET", g.RedisKey+g.ConstKey+":"+start).Str; got != "2" {
		t.Fatalf("global total %q after 2 allowed and 3 refused requests, want 2", got)
	}
}

func TestFailedSyncKeepsItsCountsAndNeverFailsOpen(t *testing.T) {
	addr, admin := startRedis(t)
	h, st, logs := syncHarness(t, addr, nil)
	client := "203.0.113.9"

	for i := 0; i < 6; i++ {
		takeOn(st, h, client)
	}

	mustSync(t, st, h.clock.Now().UnixNano())

	// Redis goes away: the lease left is spent, then the points admitted
	// without one stay pending, up to the 10 points.
	good := st.Backend.Pool
	down := redisresp.NewPool(redisresp.Options{Address: closedPort(t), Timeout: time.Second})
	st.Backend.Pool = down

	for i := 0; i < 4; i++ {
		if !takeOn(st, h, client) {
			t.Fatalf("request %d of the 4 left refused", i+1)
		}
	}

	if takeOn(st, h, client) {
		t.Fatal("an 11th request allowed while Redis is down")
	}

	now := h.clock.Now().UnixNano()
	if err := SyncNow(st, now, false); err == nil {
		t.Fatal("a sync to a closed port succeeded")
	}

	h.clock.Add(50 * time.Millisecond)
	if err := SyncNow(st, h.clock.Now().UnixNano(), false); !errors.Is(err, errSyncSkipped) {
		t.Fatalf("a sync during the back-off: %v, want it skipped", err)
	}

	for _, c := range []*SyncCounter{counterOf(st, "ip", client)} {
		if Counted(c) != 10 || c.Lease != 0 || c.Inflight != 0 {
			t.Fatalf("after failed syncs: %+v; want 10 counted, no lease, none in flight", c)
		}
	}

	if takeOn(st, h, client) {
		t.Fatal("a request allowed after failed syncs")
	}

	// Redis is back: the probe after the back-off sends the 4.
	st.Backend.Pool = good
	h.clock.Add(time.Second)
	mustSync(t, st, h.clock.Now().UnixNano())

	key := h.layer("ip").RedisKey + client + ":" + formatInt(time.Date(2026, 6, 15, 10, 0, 0, 0, time.UTC).UnixMilli())
	if got := redisDo(t, admin, "GET", key).Str; got != "10" {
		t.Fatalf("Redis total %q after recovery, want 10: the points charged during the outage were lost", got)
	}

	out := logs.String()
	if strings.Count(out, "REDIS_UNAVAILABLE") != 1 || strings.Count(out, "REDIS_RECOVERED") != 1 {
		t.Fatalf("want one REDIS_UNAVAILABLE and one REDIS_RECOVERED:\n%s", out)
	}
}

// TestPanickingSyncKeepsItsLease: a sync cut short by a panic after it
// took a lease to give back (a key no request asked for since the last
// sync) leaves the lease held, and the next sync can run.
func TestPanickingSyncKeepsItsLease(t *testing.T) {
	addr, _ := startRedis(t)
	h, st, _ := syncHarness(t, addr, nil)

	// A lease of a quarter of ip's 10 points, rounded up: 3, one spent.
	if !takeOn(st, h, "203.0.113.9") {
		t.Fatal("the first request was refused")
	}

	if c := counterOf(st, "ip", "203.0.113.9"); c.Lease != 2 {
		t.Fatalf("lease %d after one request, want 2", c.Lease)
	}

	now := h.clock.Now().UnixNano()
	if batch, _ := CollectSync(st, now, false); batch != nil {
		t.Fatalf("a sync right after the request sent %+v, want nothing", batch)
	}

	// No request since: the next sync gives the lease back, and panics.
	batch, _ := CollectSync(st, now, false)
	if c := counterOf(st, "ip", "203.0.113.9"); len(batch) != 1 || c.Lease != 0 {
		t.Fatalf("collected %d, lease %d; want the idle key's lease going back", len(batch), c.Lease)
	}

	st.Now = func() time.Time { panic("clock") }
	safeSync(st, false)

	if c := counterOf(st, "ip", "203.0.113.9"); c.Lease != 2 || c.Inflight != 0 || st.Syncing {
		t.Fatalf("after a panicking sync: lease %d, in flight %d, syncing %v; want the lease of 2 held", c.Lease, c.Inflight, st.Syncing)
	}
}

// TestSyncedBatchIsGroupedPerSlotOnACluster: on a Cluster, a sync sends one
// script call per slot: a real Cluster node (owning every slot) refuses a
// call whose keys are in several slots with CROSSSLOT.
func TestSyncedBatchIsGroupedPerSlotOnACluster(t *testing.T) {
	addr, admin := clusterNode(t)
	h, st, _ := syncHarness(t, addr, nil)

	bk := NewBackend(redisresp.Options{Cluster: &redisresp.ClusterOptions{Addresses: []string{addr}}, Timeout: 2 * time.Second})
	bk.Log = &bytes.Buffer{}
	t.Cleanup(func() { CloseBackend(bk) })

	st.Mu.Lock()
	st.Backend = bk
	st.Mu.Unlock()

	clients := []string{"203.0.113.41", "203.0.113.42", "203.0.113.43", "203.0.113.44", "203.0.113.45", "203.0.113.46"}
	slots := map[int]bool{}

	for i, client := range clients {
		for n := 0; n <= i; n++ {
			takeOn(st, h, client)
		}

		slots[redisresp.Slot(counterOf(st, "ip", client).Key)] = true
	}

	if len(slots) < 2 {
		t.Fatalf("the clients' keys share %d slot: the test needs several", len(slots))
	}

	// The last sync: every lease back, one call per slot.
	if err := SyncNow(st, h.clock.Now().UnixNano(), true); err != nil {
		t.Fatal(err)
	}

	ip := h.layer("ip")
	start, _ := SyncWindow(ip, h.clock.Now().UnixNano())

	for i, client := range clients {
		want := formatInt(int64(i + 1))
		if got := redisDo(t, admin, "GET", SyncKey(ip, client, true, start)).Str; got != want {
			t.Fatalf("%s: Redis total %q, want %s", client, got, want)
		}

		if c := counterOf(st, "ip", client); c.Remote != int64(i+1) || c.Pending != 0 || c.Lease != 0 {
			t.Fatalf("%s after the sync: %+v", client, c)
		}
	}
}

// TestIdleLeaseGoesBackToTheOtherReplicas: a key that no request asked for
// during a sync gives its lease back at the next, and another replica can
// then spend those points: b gets the 9 points a does not use.
func TestIdleLeaseGoesBackToTheOtherReplicas(t *testing.T) {
	addr, admin := startRedis(t)
	h, a, _ := syncHarness(t, addr, nil)
	b := otherReplica(a)
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

	ip := h.layer("ip")
	start, _ := SyncWindow(ip, now)
	if got := redisDo(t, admin, "GET", SyncKey(ip, client, false, start)).Str; got != "1" {
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
	addr, _ := startRedis(t)
	h, a, _ := syncHarness(t, addr, nil)
	b := otherReplica(a)
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

// TestConcurrentReplicasNeverOverAdmit: two replicas, eight goroutines
// each, one key of 50 points and 800 requests: exactly 50 allowed, each
// from a lease, while requests wait for the lease calls of others (the
// race detector runs it in make test).
func TestConcurrentReplicasNeverOverAdmit(t *testing.T) {
	addr, admin := startRedis(t)
	h, a, _ := syncHarness(t, addr, func(c *config.Config) { c.IP = config.LayerConfig{Points: 50, Duration: "60s"} })
	b := otherReplica(a)
	client := "203.0.113.63"

	var allowed atomic.Int64
	var wg sync.WaitGroup

	for g := 0; g < 16; g++ {
		st := a
		if g%2 == 1 {
			st = b
		}

		wg.Add(1)

		go func(st *SyncState) {
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

	ip := h.layer("ip")
	start, _ := SyncWindow(ip, h.clock.Now().UnixNano())
	if got := redisDo(t, admin, "GET", SyncKey(ip, client, false, start)).Str; got != "50" {
		t.Fatalf("Redis granted %q, want 50", got)
	}
}

// TestAFailingSyncKeepsTheLeaseItWasGivingBack: a sync that gives an idle
// key's lease back and fails leaves the lease held; a request of that key
// during the sync waits for it (the points are Redis's only once the call
// ends) and is then admitted from the lease.
func TestAFailingSyncKeepsTheLeaseItWasGivingBack(t *testing.T) {
	addr, admin := startRedis(t)
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
	go func() { failed <- SyncNow(st, h.clock.Now().UnixNano(), false) }()

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

	if c := counterOf(st, "ip", client); c.Lease != 1 || c.Back != 0 || c.Pending != 0 || Counted(c) != 2 {
		t.Fatalf("after the failed sync: %+v; want the lease of 2 held again, 1 of it spent", c)
	}

	// Redis answers again: the last sync gives the lease back.
	st.Backend.Pool = good
	h.clock.Add(time.Second)

	if err := SyncNow(st, h.clock.Now().UnixNano(), true); err != nil {
		t.Fatal(err)
	}

	ip := h.layer("ip")
	start, _ := SyncWindow(ip, h.clock.Now().UnixNano())
	if got := redisDo(t, admin, "GET", SyncKey(ip, client, false, start)).Str; got != "2" {
		t.Fatalf("Redis total %q after the recovery, want the 2 admitted", got)
	}
}

// TestReleasedSyncStateSendsItsPendingCharges: a synced middleware no
// configuration uses any more is released with charges its last sync did
// not send (an interval longer than the release grace): they reach Redis,
// where a replica, or the middleware configured again, finds them.
func TestReleasedSyncStateSendsItsPendingCharges(t *testing.T) {
	addr, admin := startRedis(t)
	h, st, _ := syncHarness(t, addr, nil) // syncInterval 1h
	client := "203.0.113.31"

	for i := 0; i < 3; i++ {
		if !takeOn(st, h, client) {
			t.Fatalf("request %d refused", i+1)
		}
	}

	stopSync(st)

	ip := h.layer("ip")
	start, _ := SyncWindow(ip, h.clock.Now().UnixNano())

	if v, err := admin.Do("GET", SyncKey(ip, client, false, start)); err != nil || v.Str != "3" {
		t.Fatalf("the released state's charges in Redis: %q %v, want 3", v.Str, err)
	}
}

// TestReleasedBackendFirstSendsItsSyncedCharges: the backend of a removed
// synced middleware is released at the same grace as its synced state, and
// may go first: its pool sends the state's pending points before it closes.
func TestReleasedBackendFirstSendsItsSyncedCharges(t *testing.T) {
	addr, admin := startRedis(t)
	h, st, _ := syncHarness(t, addr, nil) // syncInterval 1h
	client := "203.0.113.32"

	for i := 0; i < 4; i++ {
		if !takeOn(st, h, client) {
			t.Fatalf("request %d refused", i+1)
		}
	}

	CloseBackend(st.Backend)

	ip := h.layer("ip")
	start, _ := SyncWindow(ip, h.clock.Now().UnixNano())

	if v, err := admin.Do("GET", SyncKey(ip, client, false, start)); err != nil || v.Str != "4" {
		t.Fatalf("the synced charges in Redis after the backend closed: %q %v, want 4", v.Str, err)
	}
}
