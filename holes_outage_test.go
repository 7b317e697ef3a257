package tierlimit

import (
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/redisstore"
)

// Outage payments and the memory fallback at their edges: a
// second outage, a refund during one, a key Redis counts at exactly its
// points when it goes away.

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
	refund(storeOf(rs), chargeOf([]*layer{ip}, f.client, "", nil, h.clock.Now().UnixNano(), false), 1)

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
