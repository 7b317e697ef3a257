package tierlimit

import (
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/redisresp"
	"github.com/tierlimit/tierlimit/redisstore"
)

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
	debt := rs.Owed.Debts[owedKey{L: h.p.layers[0], Key: keyFor(h.p.layers[0], client, "", nil)}].Points
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
