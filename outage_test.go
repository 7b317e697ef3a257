package tierlimit

import (
	"bytes"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/config"
	"github.com/tierlimit/tierlimit/redisresp"
	"github.com/tierlimit/tierlimit/redisstore"
	"github.com/tierlimit/tierlimit/rule"
	"github.com/tierlimit/tierlimit/status"
)

// eventSink is an event writer that the probing goroutine and the test
// share.
type eventSink struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (s *eventSink) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()

	return s.buf.Write(p)
}

func (s *eventSink) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()

	return s.buf.String()
}

// probing gives h's backend (a test's, made without one) the probing
// goroutine that newBackend gives every backend, and an event sink.
func probing(t *testing.T, h *harness) (*redisstore.RedisBackend, *eventSink) {
	t.Helper()

	b := h.p.stores.redis.Backend
	sink := &eventSink{}
	b.Log = sink
	b.Probe.Done = make(chan struct{})
	t.Cleanup(func() { redisstore.StopProbe(b) })

	return b, sink
}

// fallbackMetric is h's tierlimit_redis_fallback sample, as /metrics shows
// it.
func fallbackMetric(t *testing.T, h *harness) string {
	t.Helper()

	text := status.Metrics(statusOf(h.p), h.clock.Now().UnixNano())
	head := `tierlimit_redis_fallback{middleware="` + h.p.name + `"} `

	i := strings.Index(text, head)
	if i < 0 {
		t.Fatalf("no %s sample in\n%s", head, text)
	}

	rest := text[i+len(head):]

	return rest[:strings.IndexByte(rest, '\n')]
}

// waitFor polls cond, the outcome of a background call (the probe, the
// payment), for up to 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()

	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited 10s for %s", what)
		}

		time.Sleep(10 * time.Millisecond) // polling a background call, not a window
	}
}

// TestRecoveryIsSeenWithoutTraffic: after an outage, an instance that
// receives no request reports Redis's recovery: the probe on the back-off's
// schedule finds Redis up, the metric goes back to 0 with one
// REDIS_RECOVERED (written before the metric moves, so that whoever sees the
// 0 finds the event), and the outage's charges are paid into Redis. While
// Redis is still away, the probes fail and the metric stays 1.
func TestRecoveryIsSeenWithoutTraffic(t *testing.T) {
	f := newFlap(t, "fixed", "203.0.113.21")
	h, proxy, admin, send := f.h, f.proxy, f.admin, f.send
	b, events := probing(t, h)
	key := h.p.layers[0].RedisKey + f.client

	send(4)
	proxy.cut()
	send(3)

	if got := fallbackMetric(t, h); got != "1" || strings.Count(events.String(), "REDIS_UNAVAILABLE") != 1 {
		t.Fatalf("during the outage: metric %s, events\n%s", got, events.String())
	}

	// Two probes fail (200 ms, then 400 ms): still down, nothing recovered.
	waitFor(t, "two failed probes", func() bool {
		b.Mu.Lock()
		defer b.Mu.Unlock()

		return b.Backoff >= 4*redisstore.MinBackoff
	})

	if got := fallbackMetric(t, h); got != "1" || strings.Contains(events.String(), "REDIS_RECOVERED") {
		t.Fatalf("Redis still cut: metric %s, events\n%s", got, events.String())
	}

	proxy.restore()

	waitFor(t, "the metric to go back to 0", func() bool { return fallbackMetric(t, h) == "0" })

	out := events.String()
	if strings.Count(out, "REDIS_RECOVERED") != 1 || strings.Index(out, "REDIS_RECOVERED") < strings.Index(out, "REDIS_UNAVAILABLE") {
		t.Fatalf("the metric is 0; want one REDIS_RECOVERED after the REDIS_UNAVAILABLE, already written:\n%s", out)
	}

	waitFor(t, "the outage's 3 in Redis", func() bool { return redisDo(t, admin, "GET", key).Str == "7" })

	if f.allowed != 7 || h.calls.Load() != 7 {
		t.Fatalf("%d allowed, %d served: the test sent traffic after the outage", f.allowed, h.calls.Load())
	}
}

// TestTheProbeStopsWithTheBackend: a released backend's probe ends, and a
// backend's next failure starts another once it ended.
func TestTheProbeStopsWithTheBackend(t *testing.T) {
	h, _ := redisHarness(t, closedPort(t), nil)
	b, _ := probing(t, h)

	h.get("/api", "203.0.113.22:1")

	running := func() bool {
		b.Mu.Lock()
		defer b.Mu.Unlock()

		return b.Probe.Running
	}

	if !running() {
		t.Fatal("no probe after a failure")
	}

	redisstore.CloseBackend(b)
	waitFor(t, "the probe to end", func() bool { return !running() })

	if b.Failed(h.clock.Now().UnixNano()+int64(time.Minute), true, redisstore.ErrBadReply); running() {
		t.Fatal("a released backend started a probe")
	}
}

// replicaOf is another process of a's middleware: h's instance with a's
// Redis keys, and a memory fallback and backend of its own.
func replicaOf(a, h *harness) *harness {
	for i, l := range h.p.layers {
		l.RedisKey = a.p.layers[i].RedisKey
	}

	// The fast path's calls are encoded with the keys.
	if h.p.fast != nil {
		h.p.fast = newRedisFast(h.p.fast.store, h.p.plans)
	}

	return h
}

// TestAnOutageAndAnEmptyRestartAdmitTheBound: two replicas of a 100-point
// window on one redis-server, fixed and sliding. 50 requests before the
// outage, 30 on each replica during it, then Redis comes back empty (its
// data lost, as a restart without persistence loses it). With no request,
// each replica's probe pays its outage's 30 into Redis, creating the key
// that Redis lost with the window's end that memory holds, so that 40 more
// get through after: 50 + 60 + 40, the bound docs/redis.md states (the 50
// before the outage lived only in Redis).
func TestAnOutageAndAnEmptyRestartAdmitTheBound(t *testing.T) {
	for _, algorithm := range []string{"fixed", "sliding"} {
		emptyRestart(t, algorithm)
	}
}

func emptyRestart(t *testing.T, algorithm string) {
	addr, admin := redisServer(t)
	proxy := newSwitchProxy(t, addr)
	replica := func() *harness {
		h, _ := redisHarness(t, proxy.l.Addr().String(), func(c *Config) {
			asACLUser(c)
			c.IP = algorithmLayer(algorithm, 100)
			c.IP.Duration = "60s"
			c.Redis.DialTimeout = "1s"
		})
		probing(t, h)

		return h
	}
	a := replica()
	b := replicaOf(a, replica())

	client := "203.0.113.23"
	key := a.p.layers[0].RedisKey + client
	allowed := 0
	send := func(h *harness, n int) {
		for i := 0; i < n; i++ {
			if h.get("/api", client+":1").Code == http.StatusOK {
				allowed++
			}
		}
	}

	send(a, 50)
	proxy.cut()
	send(a, 30)
	send(b, 30)

	if allowed != 110 {
		t.Fatalf("%s: %d allowed before and during the outage, want 110", algorithm, allowed)
	}

	redisDo(t, admin, "FLUSHALL")
	redisDo(t, admin, "SCRIPT", "FLUSH")
	proxy.restore()

	count, window := []string{"GET", key}, int64(60000)
	if algorithm == "sliding" {
		count, window = []string{"HGET", key, "c"}, 120000 // a sliding key lives one window more
	}

	waitFor(t, algorithm+": both outages' 30 in Redis", func() bool { return redisDo(t, admin, count...).Str == "60" })

	if ttl := redisDo(t, admin, "PTTL", key).Int; ttl <= window-10000 || ttl > window {
		t.Fatalf("%s: the paid key's PTTL %d ms, want %d (to the window's end)", algorithm, ttl, window)
	}

	for _, h := range []*harness{a, b} {
		waitFor(t, "the replicas' recovery", func() bool { return fallbackMetric(t, h) == "0" })
	}

	for i := 0; i < 25; i++ {
		send(a, 1)
		send(b, 1)
	}

	if allowed != 150 {
		t.Errorf("%s: %d allowed across the outage and the empty restart, want 150 (50 + 60 + 40)", algorithm, allowed)
	}
}

// TestResetSubscriptionRecoveryIsLogged: the reset subscription's loss is
// logged once (REDIS_RESETS_UNAVAILABLE) however many attempts fail, and
// its return once (REDIS_RESETS_RECOVERED), for each loss.
func TestResetSubscriptionRecoveryIsLogged(t *testing.T) {
	addr, admin := redisServer(t)
	proxy := newSwitchProxy(t, addr)
	b := redisstore.NewBackend(redisresp.Options{Address: proxy.l.Addr().String(), Timeout: time.Second, DialTimeout: time.Second})
	events := &eventSink{}
	b.Log = events
	t.Cleanup(func() { redisstore.CloseBackend(b) })

	channel := redisstore.ResetChannel("tierlimit-recovery")
	b.Resets.Listen(channel, "m@test", func(string, string) {})

	subscribed := func() bool { return redisDo(t, admin, "PUBSUB", "NUMSUB", channel).Array[1].Int == 1 }
	waitFor(t, "the subscription", subscribed)

	for loss := 1; loss <= 2; loss++ {
		proxy.cut()
		waitFor(t, "the loss's line", func() bool {
			return strings.Count(events.String(), "REDIS_RESETS_UNAVAILABLE") == loss
		})

		// Attempts keep failing (50 ms, then doubling): no line more.
		waitFor(t, "failed attempts", func() bool {
			b.Resets.Mu.Lock()
			defer b.Resets.Mu.Unlock()

			return b.Resets.Failing
		})

		if out := events.String(); strings.Count(out, "REDIS_RESETS_RECOVERED") != loss-1 {
			t.Fatalf("loss %d, still cut:\n%s", loss, out)
		}

		proxy.restore()
		waitFor(t, "the subscription again", subscribed)
		waitFor(t, "the recovery's line", func() bool {
			return strings.Count(events.String(), "REDIS_RESETS_RECOVERED") == loss
		})

		if out := events.String(); strings.Count(out, "REDIS_RESETS_UNAVAILABLE") != loss ||
			strings.LastIndex(out, "REDIS_RESETS_RECOVERED") < strings.LastIndex(out, "REDIS_RESETS_UNAVAILABLE") {
			t.Fatalf("loss %d: want one line of each, in order:\n%s", loss, out)
		}
	}
}

// TestAnOutageIsPaidToABlockingLayer: a sliding window or token bucket with
// a blockDuration is paid its outage's charges too (its script arguments
// carry the block: "1b60000"), not taken for a fixed counter and skipped.
func TestAnOutageIsPaidToABlockingLayer(t *testing.T) {
	for _, algorithm := range []string{"sliding", "tokenbucket"} {
		addr, admin := redisServer(t)
		proxy := newSwitchProxy(t, addr)
		h, _ := redisHarness(t, proxy.l.Addr().String(), func(c *Config) {
			asACLUser(c)
			c.IP = algorithmLayer(algorithm, 10)
			c.IP.BlockDuration = "1m"
			c.Redis.DialTimeout = "1s"
		})
		probing(t, h)

		client := "203.0.113.24"
		key := h.p.layers[0].RedisKey + client
		send := func(n int) {
			for i := 0; i < n; i++ {
				if code := h.get("/api", client+":1").Code; code != http.StatusOK {
					t.Fatalf("%s: %d", algorithm, code)
				}
			}
		}

		send(4)
		before := redisDo(t, admin, "HMGET", key, "c", "r", "n")
		proxy.cut()
		send(3)
		proxy.restore()

		waitFor(t, algorithm+": the recovery", func() bool { return fallbackMetric(t, h) == "0" })

		paid := func() bool {
			v := redisDo(t, admin, "HMGET", key, "c", "r", "n")
			if algorithm == "sliding" {
				return v.Array[0].Str == "7"
			}

			// A bucket of 1 token an hour holds its TAT in r (n stays 0);
			// the payment adds the outage's 3 tokens to n.
			return v.Array[1].Str == before.Array[1].Str && v.Array[2].Str == "3"
		}

		waitFor(t, algorithm+": the outage's 3 in Redis", paid)
	}
}

// switchProxy forwards TCP connections to a Redis server while up; cut
// closes every connection and refuses new ones, the server keeping its data:
// a network flap.
type switchProxy struct {
	l      net.Listener
	target string

	mu    sync.Mutex
	down  bool
	conns []net.Conn
}

func newSwitchProxy(t *testing.T, target string) *switchProxy {
	t.Helper()

	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}

	p := &switchProxy{l: l, target: target}
	t.Cleanup(func() { l.Close(); p.cut() })

	go p.serve()

	return p
}

func (p *switchProxy) serve() {
	for {
		c, err := p.l.Accept()
		if err != nil {
			return
		}

		p.mu.Lock()
		down := p.down
		if !down {
			p.conns = append(p.conns, c)
		}
		p.mu.Unlock()

		if down {
			c.Close()
			continue
		}

		up, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}

		p.mu.Lock()
		p.conns = append(p.conns, up)
		p.mu.Unlock()

		go func() { _, _ = io.Copy(up, c); up.Close() }()
		go func() { _, _ = io.Copy(c, up); c.Close() }()
	}
}

func (p *switchProxy) cut() {
	p.mu.Lock()
	p.down = true
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
	p.mu.Unlock()
}

func (p *switchProxy) restore() {
	p.mu.Lock()
	p.down = false
	p.mu.Unlock()
}

// TestAFlapDoesNotSplitACount: a 10-point key that Redis had at 4 when the
// network to it failed takes 3 more in memory (from the 4 Redis reported);
// once Redis answers again, those 3 are added to its count, so the client
// gets 10 in all across the flap, not 4 + 3 + 6. Fixed and sliding windows.
func TestAFlapDoesNotSplitACount(t *testing.T) {
	for _, algorithm := range []string{"fixed", "sliding"} {
		f := newFlap(t, algorithm, "203.0.113.7")
		h, proxy, admin, send := f.h, f.proxy, f.admin, f.send
		key := h.p.layers[0].RedisKey + f.client

		send(4)
		proxy.cut()
		send(3)

		if f.allowed != 7 || !h.p.stores.redis.Backend.Down.Load() {
			t.Fatalf("%s: %d allowed, down %v; want 7, decided in memory", algorithm, f.allowed, h.p.stores.redis.Backend.Down.Load())
		}

		// The back-off ends; the next request probes Redis, which then takes
		// the outage's 3 (off the request: wait for them).
		proxy.restore()
		h.clock.Add(time.Second)
		send(1)

		field := []string{"GET", key}
		if algorithm == "sliding" {
			field = []string{"HGET", key, "c"}
		}

		deadline := time.Now().Add(5 * time.Second)
		for redisDo(t, admin, field...).Str != "8" && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond) // polling a background call, not a window
		}

		if v := redisDo(t, admin, field...).Str; v != "8" {
			t.Fatalf("%s: Redis holds %q after the flap, want 8 (4 + the outage's 3 + the probe)", algorithm, v)
		}

		send(5)

		if f.allowed != 10 {
			t.Errorf("%s: %d allowed across the flap, want the limit of 10", algorithm, f.allowed)
		}
	}
}

// TestAFailedPaymentIsPaidAtTheNextRecovery: a payment of the outage's
// charges that Redis does not take (cut again) keeps them for the next
// recovery, instead of losing them or adding them to memory.
func TestAFailedPaymentIsPaidAtTheNextRecovery(t *testing.T) {
	f := newFlap(t, "fixed", "203.0.113.8")
	h, proxy, admin, send, client := f.h, f.proxy, f.admin, f.send, f.client
	rs := h.p.stores.redis
	key := h.p.layers[0].RedisKey + client

	send(4)
	proxy.cut()
	send(3)

	// A payment while Redis is still cut (as when it fails again right
	// after a probe): nothing is paid, nothing is lost.
	redisstore.PayOwed(rs)

	rs.Owed.Mu.Lock()
	debt := rs.Owed.Debts[redisstore.OwedKey{L: h.p.layers[0], Key: rule.KeyFor(h.p.layers[0], client, "", nil)}].Points
	rs.Owed.Mu.Unlock()

	if debt != 3 {
		t.Fatalf("owed %d after a failed payment, want the outage's 3", debt)
	}

	proxy.restore()
	h.clock.Add(10 * time.Second)
	send(1)

	deadline := time.Now().Add(5 * time.Second)
	for redisDo(t, admin, "GET", key).Str != "8" && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond) // polling a background call, not a window
	}

	if v := redisDo(t, admin, "GET", key).Str; v != "8" {
		t.Fatalf("Redis holds %q after the recovery, want 8 (4 + the outage's 3 + the probe)", v)
	}

	send(5)

	if f.allowed != 10 {
		t.Errorf("%d allowed across the outage, want the limit of 10", f.allowed)
	}
}

// TestATokenBucketFlapDoesNotSplitItsCount: the tokens a bucket's memory
// fallback handed out during an outage are taken from its bucket in Redis
// when Redis answers again: 4 before, 3 during and 3 after the outage, of a
// bucket of 10 that refills at 1 an hour.
func TestATokenBucketFlapDoesNotSplitItsCount(t *testing.T) {
	f := newFlap(t, "tokenbucket", "203.0.113.9")
	h, proxy, send := f.h, f.proxy, f.send
	rs := h.p.stores.redis

	send(4)
	proxy.cut()
	send(3)
	proxy.restore()

	// The payment a recovery starts, made here so that it is over before
	// the next request.
	redisstore.PayOwed(rs)

	h.clock.Add(10 * time.Second)
	send(10)

	if f.allowed != 10 {
		t.Errorf("%d allowed across the outage, want the bucket's 10", f.allowed)
	}
}

// flap is an instance whose ip layer, of 10 points, counts in a real
// redis-server behind a switchable proxy, and one client's requests to it.
type flap struct {
	h       *harness
	proxy   *switchProxy
	admin   *redisresp.Pool
	client  string
	allowed int // the client's requests that got 200
}

func newFlap(t *testing.T, algorithm, client string) *flap {
	t.Helper()

	addr, admin := redisServer(t)
	proxy := newSwitchProxy(t, addr)
	h, _ := redisHarness(t, proxy.l.Addr().String(), func(c *Config) {
		asACLUser(c)
		c.IP = algorithmLayer(algorithm, 10)
		c.Redis.DialTimeout = "1s"
	})

	return &flap{h: h, proxy: proxy, admin: admin, client: client}
}

// send sends n requests of the client.
func (f *flap) send(n int) {
	for i := 0; i < n; i++ {
		if f.h.get("/api", f.client+":1").Code == http.StatusOK {
			f.allowed++
		}
	}
}

// TestOutageChargesArePaidAtTheirCost: exports admitted in memory while
// Redis is unreachable are added to Redis at their cost when it answers
// again: one export before the outage and two during it leave 30 in the
// ip key and the route's key.
func TestOutageChargesArePaidAtTheirCost(t *testing.T) {
	addr, admin := redisServer(t)
	proxy := newSwitchProxy(t, addr)
	h, _ := redisHarness(t, proxy.l.Addr().String(), func(c *Config) {
		asACLUser(c)
		c.IP = config.LayerConfig{Points: 100, Duration: "1h"}
		c.Redis.DialTimeout = "1s"
		exportRoute(c)
	})
	rs := h.p.stores.redis
	client := "203.0.113.7"

	export := func() {
		t.Helper()

		if rec := h.get("/export", client+":1"); rec.Code != http.StatusOK {
			t.Fatalf("export: %d", rec.Code)
		}
	}

	export()
	proxy.cut()
	export()
	export()

	if !rs.Backend.Down.Load() {
		t.Fatal("the exports during the cut were not decided in memory")
	}

	proxy.restore()
	redisstore.PayOwed(rs)

	for _, l := range []*rule.Layer{h.p.layers[layerIndex(h, "ip")], h.p.routes[0].layer} {
		if got := redisDo(t, admin, "GET", l.RedisKey+client).Str; got != "30" {
			t.Errorf("%s in Redis after the payment: %q, want 30 (10 before the outage, 2 x 10 during it)", l.Name, got)
		}
	}
}

// waitRedis polls a background payment until Redis holds want for args (a
// GET or an HGET), and returns what it holds then.
func waitRedis(t *testing.T, f *flap, want string, args ...string) string {
	t.Helper()

	deadline := time.Now().Add(5 * time.Second)
	for redisDo(t, f.admin, args...).Str != want && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond) // polling a background call, not a window
	}

	return redisDo(t, f.admin, args...).Str
}

// TestASecondOutageIsPaidToo: two outages in a row, each followed by a
// recovery; after each, Redis holds every request charged, the outage's
// included, once. A payment that left its debts listed would never pay the
// second outage; one that kept them would pay the first twice.
func TestASecondOutageIsPaidToo(t *testing.T) {
	f := newFlap(t, "fixed", "203.0.113.20")
	h, proxy, send := f.h, f.proxy, f.send
	rs := h.p.stores.redis
	key := h.p.layers[0].RedisKey + f.client

	send(2)

	for outage, want := range []string{"5", "8"} {
		proxy.cut()
		send(2)

		if !rs.Backend.Down.Load() {
			t.Fatalf("outage %d: not decided in memory", outage+1)
		}

		// The back-off ends; the request after it probes Redis, which then
		// takes the outage's 2 off the request.
		proxy.restore()
		h.clock.Add(time.Minute)
		send(1)

		if got := waitRedis(t, f, want, "GET", key); got != want {
			t.Fatalf("Redis holds %q after outage %d, want %s: every request charged so far, once", got, outage+1, want)
		}

		h.clock.Add(time.Second)
	}

	send(5)

	if f.allowed != 10 {
		t.Errorf("%d allowed across two outages, want the limit of 10", f.allowed)
	}
}

// TestARefundDuringAnOutageIsNotPaidToRedis: a request charged by the
// memory fallback and refunded during the outage (a later layer refused it)
// owes Redis nothing at the recovery.
func TestARefundDuringAnOutageIsNotPaidToRedis(t *testing.T) {
	f := newFlap(t, "fixed", "203.0.113.21")
	h, proxy, send := f.h, f.proxy, f.send
	rs := h.p.stores.redis
	ip := h.p.layers[0]
	key := ip.RedisKey + f.client

	send(4)
	proxy.cut()
	send(3)

	// One of the outage's 3 is given back, as the refund of a request that
	// a later layer refused.
	refund(storeOf(rs), chargeOf([]*rule.Layer{ip}, f.client, "", nil, h.clock.Now().UnixNano(), false), 1)

	proxy.restore()
	redisstore.PayOwed(rs)

	if got := redisDo(t, f.admin, "GET", key).Str; got != "6" {
		t.Fatalf("Redis holds %q after the recovery, want 6: 4 before and the 2 of the outage not refunded", got)
	}
}

// TestFallbackRefusesAKeyRedisHadAtItsPoints: a key that Redis counted at
// exactly its points when it went away is refused by the memory fallback,
// for every algorithm (the fixed ip layer on modeRedis's path, the others on
// the general path): one more would be one extra request per key and
// replica.
func TestFallbackRefusesAKeyRedisHadAtItsPoints(t *testing.T) {
	for _, algorithm := range []string{"fixed", "sliding", "tokenbucket"} {
		f := newFlap(t, algorithm, "203.0.113.22")

		f.send(10)
		if f.allowed != 10 {
			t.Fatalf("%s: Redis allowed %d of 10", algorithm, f.allowed)
		}

		f.proxy.cut()
		f.send(3)

		if !f.h.p.stores.redis.Backend.Down.Load() {
			t.Fatalf("%s: not decided in memory", algorithm)
		}

		if f.allowed != 10 {
			t.Errorf("%s: the fallback allowed %d more of a key Redis had at its 10 points, want 0", algorithm, f.allowed-10)
		}
	}
}
