package tierlimit

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/config"
	"github.com/tierlimit/tierlimit/lifetime"
	"github.com/tierlimit/tierlimit/redisresp"
	"github.com/tierlimit/tierlimit/redisstore"
	"github.com/tierlimit/tierlimit/request"
)

// keepTimers drives a keeping registry: its clock and its timers, which the
// test fires, so that no test waits for a grace or a window.
type keepTimers struct {
	now     int64
	started chan keepTimer
}

type keepTimer struct {
	d time.Duration
	f func()
}

func newKeepTimers(r *lifetime.HeldRegistry, now int64) *keepTimers {
	kt := &keepTimers{now: now, started: make(chan keepTimer, 16)}
	r.Now = func() time.Time { return time.Unix(0, kt.now) }
	r.After = func(d time.Duration, f func()) { kt.started <- keepTimer{d, f} }

	return kt
}

// next returns the next timer started; the first one after a ctx is
// cancelled is started on a goroutine of context.AfterFunc's, hence the
// wait (with a deadline).
func (kt *keepTimers) next(t *testing.T) keepTimer {
	t.Helper()

	select {
	case tm := <-kt.started:
		return tm
	case <-time.After(5 * time.Second):
		t.Fatal("no timer started")
		return keepTimer{}
	}
}

// fire moves the clock to the timer's end and runs it.
func (kt *keepTimers) fire(tm keepTimer) {
	kt.now += int64(tm.d)
	tm.f()
}

// TestUnheldConnectionCounterKeptWhileConnectionsAreOpen: a removed
// middleware's WebSocket connections stay open; their counter is kept
// (checked every grace) until they close, so the middleware configured
// again does not admit maxConnectionsPerIP more.
func TestUnheldConnectionCounterKeptWhileConnectionsAreOpen(t *testing.T) {
	r := lifetime.NewKeepingRegistry(connLive)
	kt := newKeepTimers(r, t0)

	ctx, cancel := context.WithCancel(context.Background())
	c, _ := r.Take(ctx, "rl@file", func() interface{} {
		return &connCounter{byIP: map[string]int{}, logged: map[string]bool{}, max: 5}
	}).(*connCounter)
	c.acquire("198.51.100.7")
	cancel()

	kt.fire(kt.next(t))

	tm := kt.next(t)
	if tm.d != lifetime.ReleaseGrace || r.Size() != 1 {
		t.Fatalf("with a connection open: %d entries, checked again in %s", r.Size(), tm.d)
	}

	c.release("198.51.100.7")
	kt.fire(tm)

	if r.Size() != 0 {
		t.Fatal("connection counter kept after its connections closed")
	}
}

// fakeTimers stands in for time.AfterFunc: the grace timers are fired by the
// test, so no test waits for releaseGrace.
type fakeTimers struct {
	started chan func()
}

func newFakeTimers(r *lifetime.HeldRegistry) *fakeTimers {
	ft := &fakeTimers{started: make(chan func(), 16)}
	r.After = func(d time.Duration, f func()) {
		if d != lifetime.ReleaseGrace {
			panic("grace timer of " + d.String())
		}

		ft.started <- f
	}

	return ft
}

// next returns the next grace timer started; context.AfterFunc runs the
// release on a goroutine of its own, hence the wait (with a deadline).
func (ft *fakeTimers) next(t *testing.T) func() {
	t.Helper()

	select {
	case f := <-ft.started:
		return f
	case <-time.After(5 * time.Second):
		t.Fatal("no grace timer started after the last holder's ctx was cancelled")
		return nil
	}
}

// ownBackends gives the test a registry of Redis backends of its own, whose
// grace timers it fires (fakeTimers), in place of the process's.
func ownBackends(t *testing.T) *fakeTimers {
	t.Helper()

	saved := redisstore.Backends
	reg := &redisstore.BackendRegistry{ByConfig: lifetime.NewHeldRegistry(redisstore.CloseBackend)}
	ft := newFakeTimers(reg.ByConfig)
	redisstore.Backends = reg
	t.Cleanup(func() { redisstore.Backends = saved })

	return ft
}

// streamOnRedis is a costFrom route reserving 300 of 1000 tokens a minute
// per X-Api-Key, beside a concurrency layer of 2 per IP, on exact Redis at
// addr with the timeout given (a backend per timeout).
func streamOnRedis(addr, timeout string) func(c *Config) {
	return with(meteredRoute("json:usage.total_tokens", 300), func(c *Config) {
		c.Store = "redis"
		c.Redis.Address = addr
		c.Redis.Timeout = timeout
		asACLUser(c)
		c.IP = config.LayerConfig{Points: 2, Duration: "60s", Algorithm: "concurrency"}
	})
}

// streamAcrossReload opens a stream on an instance of streamOnRedis, reloads
// to reload's configuration (the old ctx cancelled), lets the old backend's
// grace pass (its pool closed then), calls during with the new instance,
// then has the stream report 700 tokens and end. It returns the old
// instance, the new one and the keys of the route and of the slots.
func streamAcrossReload(t *testing.T, addr string, reload func(c *Config), during func(r *harness)) (h, r *harness, key, slots string) {
	t.Helper()

	ft := ownBackends(t)
	h = newProxiedHarness(t, streamOnRedis(addr, "1s"))
	sb := newStepBackend("text/event-stream")
	h.backend = sb

	old := h.p.stores.redis.Backend
	key = h.p.stores.redis.Prefix + "llm:" + request.HashKey("k1")
	slots = h.p.stores.redis.Prefix + "ip:203.0.113.1"

	o := h.open(http.MethodPost, "/v1/chat/completions", "203.0.113.1:1", map[string]string{"X-Api-Key": "k1"})
	s := sb.next(t)
	s.send("data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}],\"usage\":null}\n\n")
	o.readUntil("\n\n")

	r = reloaded(t, h, reload)
	ft.next(t)() // the old backend's grace has passed

	if _, err := old.Pool.(*redisresp.Pool).Do("PING"); !errors.Is(err, redisresp.ErrClosed) {
		t.Fatalf("the old backend's pool after its grace: %v, want ErrClosed", err)
	}

	if during != nil {
		during(r)
	}

	s.send("data: {\"choices\":[],\"usage\":{\"total_tokens\":700}}\n\n")
	s.send("data: [DONE]\n\n")
	s.end()
	o.readAll()
	o.wait()

	return h, r, key, slots
}

// TestAReloadOfRedisSettingsKeepsTheSettlementOfAStreamInFlight: a stream
// on exact Redis (a costFrom route reserving 300, beside a concurrency
// layer) is held open across a reload that changes a redis setting (a new
// backend) and past the old backend's release grace, which closes the old
// pool, then reports 700 and ends: the settlement and the slot's release
// go through the new pool. The key counts 700, the slot is free.
func TestAReloadOfRedisSettingsKeepsTheSettlementOfAStreamInFlight(t *testing.T) {
	addr, admin := redisServer(t)

	_, _, key, slots := streamAcrossReload(t, addr, streamOnRedis(addr, "2s"), func(*harness) {
		if got := redisDo(t, admin, "ZCARD", slots0(admin)).Int; got != 1 {
			t.Fatalf("%d slots taken in Redis while the stream runs, want 1", got)
		}
	})

	if got := redisDo(t, admin, "GET", key).Str; got != "700" {
		t.Errorf("Redis holds %q for the stream's key, want the 700 it reported", got)
	}

	if got := redisDo(t, admin, "ZCARD", slots).Int; got != 0 {
		t.Errorf("%d slots taken in Redis once the stream has ended, want 0", got)
	}
}

// slots0 is the one concurrency key on the server.
func slots0(admin *redisresp.Pool) string {
	v, err := admin.Do("KEYS", "*:ip:*")
	if err != nil || len(v.Array) != 1 {
		return ""
	}

	return v.Array[0].Str
}

// TestASettlementAfterAReloadIsOwedDuringAnOutage: as above, but the new
// configuration's Redis is in an outage when the stream ends: the reported
// cost beyond the reservation is owed, as the fallback's charges are, and
// paid when Redis answers again.
func TestASettlementAfterAReloadIsOwedDuringAnOutage(t *testing.T) {
	addr, admin := redisServer(t)

	_, r, key, _ := streamAcrossReload(t, addr, streamOnRedis(addr, "2s"), func(r *harness) {
		r.p.stores.redis.Backend.Failed(r.clock.Now().UnixNano(), false, errors.New("an outage"))
	})

	if got := redisDo(t, admin, "GET", key).Str; got != "300" {
		t.Fatalf("Redis holds %q during the outage, want the reservation of 300 (the rest owed)", got)
	}

	b := r.p.stores.redis.Backend
	redisstore.StopProbe(b) // the test recovers it
	b.Succeeded(r.clock.Now().UnixNano())

	deadline := time.Now().Add(10 * time.Second)
	for redisDo(t, admin, "GET", key).Str != "700" {
		if time.Now().After(deadline) {
			t.Fatalf("Redis holds %q once it answers again, want the 700 reported", redisDo(t, admin, "GET", key).Str)
		}

		time.Sleep(5 * time.Millisecond)
	}
}

// TestASettlementAfterAReloadToMemoryIsChargedInMemory: the reload puts the
// middleware in memory: the cost the stream reported is charged to the
// middleware's memory counters (its reservation, as Redis reported it, and
// the rest), which the new instance counts in.
func TestASettlementAfterAReloadToMemoryIsChargedInMemory(t *testing.T) {
	addr, _ := redisServer(t)

	_, r, _, _ := streamAcrossReload(t, addr, with(streamOnRedis(addr, "2s"), func(c *Config) { c.Store = "memory" }), nil)

	if got := peekCount(r.p.memory, r.clock.Now().UnixNano(), "llm", request.HashKey("k1")); got != 700 {
		t.Errorf("memory counts %d for the stream's key, want the 700 reported", got)
	}
}
