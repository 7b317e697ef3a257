package tierlimit

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/memstore"
	"github.com/tierlimit/tierlimit/redisresp"
	"github.com/tierlimit/tierlimit/redisstore"
)

// A reset message clears the key's block list entries of the layer it names,
// under whatever limits they were made, and the key's memory window, for the
// middleware it names only.
func TestResetMessageClearsTheNamedKeyOnly(t *testing.T) {
	now := t0
	reset := now + int64(time.Hour)
	bl := redisstore.NewBlockList(100)
	ws := memstore.NewWindowStore(100)
	l := testLayer(ws, "ip", 1, time.Hour)
	other := testLayer(ws, "ipx", 1, time.Hour)
	req := httptest.NewRequest(http.MethodGet, "/", nil)

	bl.Add("ip\x00points 5\x00", "203.0.113.7", reset, now)
	bl.Add("ip\x00points 9\x00", "203.0.113.7", reset, now) // before a reload changed the limits
	bl.Add("ip\x00points 5\x00", "203.0.113.8", reset, now)
	bl.Add("ipx\x00points 5\x00", "203.0.113.7", reset, now)

	for _, lay := range []*layer{l, other} {
		var tl tally
		take(storeOf(ws), &tl, chargeOf([]*layer{lay}, "203.0.113.7", "", req, now, false))
	}

	// A block the memory fallback started (takeLocal), and the
	// middleware's clock, which the reset reads instead of time.Now.
	ws.Blocks["ip"]["203.0.113.7"] = reset
	ws.Blocks["ip"]["203.0.113.8"] = reset
	clockReads := 0
	clock := func() time.Time { clockReads++; return time.Unix(0, now) }

	r := redisstore.NewResetListener(&redisBackend{}, redisresp.Options{})
	r.Targets["ratelimit:resets"] = map[string]resetForget{"edge@file": redisstore.ForgetIn(bl, ws, clock)}

	// Another middleware's, another channel's and a malformed message.
	r.Dispatch(redisresp.Message{Channel: "ratelimit:resets", Payload: redisstore.ResetMessage("other@file", "ip", "203.0.113.7")})
	r.Dispatch(redisresp.Message{Channel: "other:resets", Payload: redisstore.ResetMessage("edge@file", "ip", "203.0.113.7")})
	r.Dispatch(redisresp.Message{Channel: "ratelimit:resets", Payload: "edge@file ip 203.0.113.7"})

	if bl.Size.Load() != 4 || peekCount(ws, now, "ip", "203.0.113.7") != 1 {
		t.Fatalf("a message for someone else cleared something: %d entries, %v", bl.Size.Load(), bl.Until)
	}

	r.Dispatch(redisresp.Message{Channel: "ratelimit:resets", Payload: redisstore.ResetMessage("edge@file", "ip", "203.0.113.7")})

	if bl.ResetOf("ip\x00points 5\x00", "203.0.113.7", now) != 0 || bl.ResetOf("ip\x00points 9\x00", "203.0.113.7", now) != 0 {
		t.Fatalf("the key is still blocked: %v", bl.Until)
	}

	if bl.ResetOf("ip\x00points 5\x00", "203.0.113.8", now) != reset || bl.ResetOf("ipx\x00points 5\x00", "203.0.113.7", now) != reset {
		t.Fatalf("another key or layer was cleared: %v", bl.Until)
	}

	if _, ok := ws.Blocks["ip"]["203.0.113.7"]; ok || ws.Blocks["ip"]["203.0.113.8"] != reset {
		t.Fatalf("the memory fallback's blocks after the reset: %v", ws.Blocks["ip"])
	}

	if clockReads == 0 {
		t.Fatal("the reset did not read the middleware's clock")
	}

	if peekCount(ws, now, "ip", "203.0.113.7") != 0 || peekCount(ws, now, "ipx", "203.0.113.7") != 1 {
		t.Fatal("the memory windows: the key's is kept, or another layer's went")
	}
}

// Two replicas on one redis-server: each refused the client itself, so
// each blocks it locally. A reset through A reaches B's block list and
// memory fallback through the channel, and B lets the client in again. B
// subscribes only once it blocks a key, and stops when its backend is
// released.
func TestResetReachesAnotherReplicasBlockListOnRedisServer(t *testing.T) {
	addr, admin := redisServer(t)
	h, _ := redisHarness(t, addr, func(c *Config) {
		asACLUser(c)
		c.Status.Path = "/_rl"
		c.IP = LayerConfig{Points: 2, Duration: "1h"}
	})
	a := h.p.stores.redis

	// Replica B: the same middleware (name, layers, keys) with a backend, a
	// block list and a memory fallback of its own.
	bb := redisstore.NewBackend(redisresp.Options{Address: addr, Username: "tierlimit", Password: aclPassword, Timeout: time.Second})
	bb.Log = &bytes.Buffer{}
	b := &redisStore{Prefix: a.Prefix, Name: a.Name, Channel: a.Channel, Backend: bb, Local: memstore.NewWindowStore(100), Blocked: redisstore.NewBlockList(100), Calls: a.Calls}
	b.Blocks = false
	b.Clock = time.Now
	layers := h.p.layers[:1]
	client, other := "203.0.113.7", "203.0.113.8"
	now := h.clock.Now().UnixNano()

	take := func(s *redisStore, client string) tally {
		var tl tally
		take(storeOf(s), &tl, chargeOf(layers, client, "", httptest.NewRequest(http.MethodGet, "/api", nil), now, false))
		return tl
	}

	numsub := func() int64 {
		v := redisDo(t, admin, "PUBSUB", "NUMSUB", a.Channel)
		return v.Array[1].Int
	}

	h.burst(client, 2)
	take(b, other)
	take(b, other)

	if numsub() != 0 {
		t.Fatal("a replica without block list entries subscribed")
	}

	if h.get("/api", client+":1").Code != http.StatusTooManyRequests || !take(b, client).Refused || !take(b, other).Refused {
		t.Fatal("the clients are not refused")
	}

	var memory tally
	memstore.Take(b.Local, &memory, chargeOf(layers, client, "", nil, now, false))

	waitUntil(t, "B subscribes", func() bool { return numsub() == 1 })

	if code, doc := h.reset("?layer=ip&key="+client, ""); code != http.StatusOK || !doc.BlockList {
		t.Fatalf("reset: %d %+v", code, doc)
	}

	waitUntil(t, "B forgets the key", func() bool { return b.Blocked.ResetOf(layers[0].BlockPrefix, client, now) == 0 })

	if peekCount(b.Local, now, "ip", client) != 0 {
		t.Fatal("B's memory fallback still counts the key")
	}

	if b.Blocked.ResetOf(layers[0].BlockPrefix, other, now) == 0 {
		t.Fatal("B forgot another key")
	}

	if tl := take(b, client); tl.Refused || h.get("/api", client+":1").Code != http.StatusOK {
		t.Fatal("the client is refused after the reset")
	}

	redisstore.CloseBackend(bb)
	waitUntil(t, "B unsubscribes once released", func() bool { return numsub() == 0 })
}

// waitUntil polls cond until it holds, failing after a generous bound: for
// what another goroutine does, never for a window.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()

	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out: %s", what)
		}
	}
}
