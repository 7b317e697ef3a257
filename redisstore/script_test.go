package redisstore

import (
	"github.com/tierlimit/tierlimit/rediscall"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/config"
	"github.com/tierlimit/tierlimit/limit"
	"github.com/tierlimit/tierlimit/redisresp"
	"github.com/tierlimit/tierlimit/rule"
)

// The scripts on a real redis-server, through the store: costs charged
// whole, refunds, a denied read, odd keys, a Cluster's calendar key.

// readmeACL is README.md's ACL SETUSER command for the plugin's user, with
// aclPassword: the tests' instances connect as that user (asACLUser), so a
// script command the ACL does not grant fails them.
func readmeACL(t *testing.T) []string {
	t.Helper()

	doc, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}

	for _, line := range strings.Split(string(doc), "\n") {
		if args := strings.Fields(line); len(args) > 3 && args[0] == "ACL" && args[1] == "SETUSER" && args[2] == "tierlimit" {
			return strings.Fields(strings.ReplaceAll(line, "PASSWORD", aclPassword))
		}
	}

	t.Fatal("README.md has no ACL SETUSER tierlimit line")

	return nil
}

// aclPassword is the password of README.md's ACL user on redisServer.
const aclPassword = "acl-secret"

// asACLUser connects an instance as README.md's ACL user.
func asACLUser(c *config.Config) {
	c.Redis.Username = "tierlimit"
	c.Redis.Password = aclPassword
}

// serverState is every key on the server, serialized (DUMP) with its
// absolute expiry (PEXPIRETIME): unchanged unless a script writes the key.
func serverState(t *testing.T, p *redisresp.Pool) string {
	t.Helper()

	var b strings.Builder

	for _, k := range redisDo(t, p, "KEYS", "*").Array {
		b.WriteString(k.Str + " " + strconv.Quote(redisDo(t, p, "DUMP", k.Str).Str) + " " +
			strconv.FormatInt(redisDo(t, p, "PEXPIRETIME", k.Str).Int, 10) + "\n")
	}

	return b.String()
}

// scriptCharge runs takeScript for layers with a cost, as takeRedis does for a cost
// of 1, and returns the outcome.
func scriptCharge(t *testing.T, s *RedisStore, layers []*rule.Layer, client string, cost int64) rule.Tally {
	t.Helper()

	ints, serverErr, err := CallFor(s, len(layers)).RunIntsOn(s.Backend.Pool, EncodeCall(chargeOf(layers, client, time.Now().UnixNano()), ArgStopAtRefusal, cost))
	if err != nil || serverErr != "" {
		t.Fatalf("script: %v %s", err, serverErr)
	}

	var tl rule.Tally
	if err := Record(s, &tl, chargeOf(layers, client, t0), ints); err != nil {
		t.Fatalf("reply %v: %v", ints, err)
	}

	return tl
}

// algorithmLayer is a layer of points with algorithm, an hour long; a token
// bucket's burst is points.
func algorithmLayer(algorithm string, points int) config.LayerConfig {
	if algorithm == "tokenbucket" {
		return config.LayerConfig{Points: 1, Duration: "1h", Algorithm: algorithm, Burst: points}
	}

	return config.LayerConfig{Points: points, Duration: "1h", Algorithm: algorithm}
}

// redisServer is startRedis with README.md's ACL user (asACLUser), so that
// a script command the ACL does not grant fails the store's calls.
func redisServer(t *testing.T) (string, *redisresp.Pool) {
	t.Helper()

	addr, admin := startRedis(t)
	redisDo(t, admin, readmeACL(t)...)

	return addr, admin
}

// takeIn is Take of client in layers at now, and its tally.
func takeIn(s *RedisStore, now int64, layers []*rule.Layer, client string) rule.Tally {
	var t rule.Tally
	Take(s, &t, chargeOf(layers, client, now))

	return t
}

// TestCostIsChargedWholeOnRedisServer: a request of cost 3 counts 3 in each
// layer; one that does not fit is refused whole, changing no key (the first
// layer, which it fits, included); a smaller one that fits is still allowed.
func TestCostIsChargedWholeOnRedisServer(t *testing.T) {
	addr, admin := redisServer(t)

	for _, algorithm := range []string{"fixed", "sliding", "tokenbucket"} {
		h, _ := newStoreHarness(t, addr, func(c *config.Config) {
			asACLUser(c)
			c.Global = algorithmLayer(algorithm, 100)
			c.IP = algorithmLayer(algorithm, 5)
		})
		s := h.store
		layers := h.layers

		for i, step := range []struct {
			cost    int64
			refused bool
			ip      int64 // the count reported
		}{
			{cost: 3, ip: 3},
			{cost: 3, refused: true, ip: 6},
			{cost: 2, ip: 5},
			{cost: 1, refused: true, ip: 6},
		} {
			before := serverState(t, admin)
			tl := scriptCharge(t, s, layers, "203.0.113.1", step.cost)
			after := serverState(t, admin)

			if tl.Refused != step.refused || tl.Shown != 1 || tl.Count != step.ip {
				t.Fatalf("%s, step %d (cost %d): %+v, want refused %v with ip at %d", algorithm, i, step.cost, tl, step.refused, step.ip)
			}

			if step.refused && after != before {
				t.Fatalf("%s, step %d: the refused request changed Redis:\n%s\nto\n%s", algorithm, i, before, after)
			}

			if !step.refused && after == before {
				t.Fatalf("%s, step %d: the allowed request changed nothing", algorithm, i)
			}
		}

		// global holds the 5 allowed, not the 9 asked for.
		if tl := scriptCharge(t, s, layers[:1], "203.0.113.1", 1); tl.Count != 6 {
			t.Fatalf("%s: global at %d after 5 allowed, want 6 with this one", algorithm, tl.Count)
		}
	}
}

// TestRefundGivesBackOnRedisServer: a refund of 1 takes each layer back to
// where it was before the charge, for every algorithm; it creates no key,
// takes no count below zero, and a token bucket that is full again loses
// its key.
func TestRefundGivesBackOnRedisServer(t *testing.T) {
	addr, admin := redisServer(t)

	for _, algorithm := range []string{"fixed", "sliding", "tokenbucket"} {
		h, _ := newStoreHarness(t, addr, func(c *config.Config) {
			asACLUser(c)
			c.Global = algorithmLayer(algorithm, 10)
			c.IP = algorithmLayer(algorithm, 10)
		})
		s := h.store
		layers := h.layers

		for i := 0; i < 3; i++ {
			scriptCharge(t, s, layers, "203.0.113.1", 1)
		}

		Refund(s, chargeOf(layers, "203.0.113.1", t0), 1)

		// Both layers hold 2 again: the next request makes 3, not 4.
		tl := scriptCharge(t, s, layers, "203.0.113.1", 1)
		if tl.Count != 3 || tl.Shown != 0 {
			t.Fatalf("%s: after the refund %+v, want both layers at 3", algorithm, tl)
		}

		if tl := scriptCharge(t, s, layers[1:], "203.0.113.1", 1); tl.Count != 4 {
			t.Fatalf("%s: ip at %d, want 4", algorithm, tl.Count)
		}

		// A key never charged is not created.
		Refund(s, chargeOf(layers, "203.0.113.2", t0), 1)

		if n := redisDo(t, admin, "EXISTS", layers[1].RedisKey+"203.0.113.2").Int; n != 0 {
			t.Fatalf("%s: the refund created a key", algorithm)
		}

		// Given back to a count of one, twice: nothing below zero; a token
		// bucket full again has no key.
		scriptCharge(t, s, layers[1:], "203.0.113.3", 1)
		Refund(s, chargeOf(layers[1:], "203.0.113.3", t0), 1)
		Refund(s, chargeOf(layers[1:], "203.0.113.3", t0), 1)

		key := layers[1].RedisKey + "203.0.113.3"
		switch algorithm {
		case "fixed":
			if v := redisDo(t, admin, "GET", key).Str; v != "0" {
				t.Fatalf("fixed counter %q after two refunds of one charge, want 0", v)
			}
		case "sliding":
			if v := redisDo(t, admin, "HGET", key, "c").Str; v != "0" {
				t.Fatalf("sliding count %q after two refunds of one charge, want 0", v)
			}
		default:
			if n := redisDo(t, admin, "EXISTS", key).Int; n != 0 {
				t.Fatalf("token bucket key left after its only charge was given back")
			}
		}

		// A refund gives back its cost: 3 charged, 2 given back, 1 held.
		scriptCharge(t, s, layers[1:], "203.0.113.4", 3)
		Refund(s, chargeOf(layers[1:], "203.0.113.4", t0), 2)

		if tl := scriptCharge(t, s, layers[1:], "203.0.113.4", 1); tl.Count != 2 {
			t.Fatalf("%s: after 3 charged and 2 given back, the next request makes %d, want 2", algorithm, tl.Count)
		}

		if ttl := redisDo(t, admin, "PTTL", key).Int; algorithm != "tokenbucket" && (ttl <= 0 || ttl > 2*int64(time.Hour/time.Millisecond)) {
			t.Fatalf("%s: PTTL %d after the refunds: the key must keep its expiry", algorithm, ttl)
		}
	}
}

// TestRefundWhileRedisIsDownCallsNoRedis: in back-off, a refund goes to the
// memory fallback, which took the charge, and sends Redis nothing.
func TestRefundWhileRedisIsDownCallsNoRedis(t *testing.T) {
	srv := newCannedRedis(t, "*1\r\n:0\r\n")
	h, _ := newStoreHarness(t, srv.l.Addr().String(), nil)
	s := h.store

	Refund(s, chargeOf(h.layers, "203.0.113.1", t0), 1)

	if srv.commands.Load() != 1 {
		t.Fatalf("%d commands with Redis up, want the one refund call", srv.commands.Load())
	}

	s.Backend.Failed(t0, false, ErrBadReply)
	Refund(s, chargeOf(h.layers, "203.0.113.1", t0), 1)

	if srv.commands.Load() != 1 {
		t.Fatalf("%d commands: a refund in back-off called Redis", srv.commands.Load())
	}
}

// TestDeniedReadFailsTheScriptOnRedisServer: a user whose ACL lacks a command
// the script reads a live counter with (INCRBY here, GET under earlier
// scripts) gets a script error, so memory decides and Redis is reported
// unavailable, instead of every key reading as empty and nothing ever being
// refused.
func TestDeniedReadFailsTheScriptOnRedisServer(t *testing.T) {
	addr, admin := redisServer(t)

	acl := readmeACL(t)
	for i, a := range acl {
		if a == "tierlimit" {
			acl[i] = "noincr"
		}
	}

	redisDo(t, admin, append(acl, "-incrby")...)

	h, logs := newStoreHarness(t, addr, func(c *config.Config) {
		c.Redis.Username, c.Redis.Password = "noincr", aclPassword
	})
	s := h.store
	key := h.layers[0].RedisKey + "203.0.113.1"

	// A new key is set, which the ACL grants; the next request reads it.
	if tl := takeIn(s, t0, h.layers, "203.0.113.1"); s.Backend.Down.Load() || tl.Count != 1 {
		t.Fatalf("first request: tally %+v, logs %q", tl, logs)
	}

	tl := takeIn(s, t0, h.layers, "203.0.113.1")

	// Memory starts from the 1 Redis reported (redisstore/fallback.go).
	if !s.Backend.Down.Load() || !strings.Contains(logs.String(), "REDIS_UNAVAILABLE") || tl.Count != 2 {
		t.Fatalf("tally %+v, logs %q: want memory to decide, from the count Redis reported, and Redis reported unavailable", tl, logs)
	}

	if v := redisDo(t, admin, "GET", key).Str; v != "1" {
		t.Fatalf("ip key %q after a failed read, want the first request's 1", v)
	}
}

// TestOddFixedKeysStartAfreshOnRedisServer: a fixed layer's key that holds
// no live counter (of another kind, not an integer, negative, without a TTL,
// or living longer than the window) is read as empty and restarted by an
// allowed request, with the window's TTL; a request another layer refuses
// leaves each of them, and every live counter it reads, as it was.
func TestOddFixedKeysStartAfreshOnRedisServer(t *testing.T) {
	addr, admin := redisServer(t)

	h, _ := newStoreHarness(t, addr, func(c *config.Config) {
		asACLUser(c)
		c.Global = config.LayerConfig{Points: 1000, Duration: "1h"}
		c.IP = config.LayerConfig{Points: 2, Duration: "1h"}
	})
	s := h.store
	layers := h.layers
	global := layers[0].RedisConstKey
	global = global[strings.Index(global, "\r\n")+2 : len(global)-2]

	odd := map[string][]string{
		"hash":     {"HSET", global, "c", "5"},
		"text":     {"SET", global, "five", "PX", "60000"},
		"negative": {"SET", global, "-3", "PX", "60000"},
		"no ttl":   {"SET", global, "7"},
		"stale":    {"SET", global, "7", "PX", "86400000"},
	}

	fresh := 100

	for name, setup := range odd {
		fresh++

		redisDo(t, admin, "DEL", global)
		redisDo(t, admin, setup...)

		// The ip key is spent by two requests of another client first: the
		// third is refused by ip, after global was read (and charged, then
		// given back, when it held a live counter).
		client := "203.0.113.50"
		redisDo(t, admin, "SET", layers[1].RedisKey+client, "2", "PX", "60000")

		before := serverState(t, admin)
		if tl := scriptCharge(t, s, layers, client, 1); !tl.Refused || tl.Shown != 1 {
			t.Fatalf("%s: %+v, want refused by ip", name, tl)
		}

		if after := serverState(t, admin); after != before {
			t.Fatalf("%s: the refused request changed Redis:\n%s\nto\n%s", name, before, after)
		}

		if tl := scriptCharge(t, s, layers, "203.0.113."+strconv.Itoa(fresh), 1); tl.Refused || tl.Count != 1 {
			t.Fatalf("%s: %+v, want allowed with a fresh global and ip", name, tl)
		}

		if v := redisDo(t, admin, "GET", global).Str; v != "1" {
			t.Fatalf("%s: global holds %q, want a fresh 1", name, v)
		}

		if ttl := redisDo(t, admin, "PTTL", global).Int; ttl <= 0 || ttl > 3600000 {
			t.Fatalf("%s: global's PTTL %d, want the window's", name, ttl)
		}
	}

	// A live counter a refusal read is given back byte for byte.
	redisDo(t, admin, "SET", global, "41", "PX", "60000")

	before := serverState(t, admin)
	if tl := scriptCharge(t, s, layers, "203.0.113.50", 1); !tl.Refused {
		t.Fatalf("%+v, want refused by ip", tl)
	}

	if after := serverState(t, admin); after != before {
		t.Fatalf("the refused request changed Redis:\n%s\nto\n%s", before, after)
	}
}

// On a cluster a calendar layer's key and window are those of the period that
// holds the request's time (the instance's clock), not the wall clock's.
func TestClusterCalendarKeyFollowsTheRequestTime(t *testing.T) {
	l := &rule.Layer{Limits: rule.Limits{Name: "ip", Capacity: 5, KeyKind: rule.KeyOfClient, Calendar: limit.Day}, Encoding: &rediscall.Encoding{RedisKey: "ratelimit:mw:ip:"}}
	l.RedisArgs = redisresp.Bulk("5") + redisresp.Bulk("86400000") + algoFixed + argNoRate
	l.RedisTail = RedisTail(l.RedisArgs)
	now := time.Date(2026, 2, 10, 18, 0, 0, 0, time.UTC).UnixNano()

	groups := slotGroups(chargeOf([]*rule.Layer{l}, "198.51.100.7", now), "")

	start := time.Date(2026, 2, 10, 0, 0, 0, 0, time.UTC).Unix()
	if want := redisresp.Bulk("ratelimit:mw:ip:{198.51.100.7}:" + strconv.FormatInt(start, 10)); len(groups) != 1 || groups[0].Keys != want {
		t.Fatalf("keys %q, want %q", groups[0].Keys, want)
	}

	// 6 hours to the end of the day.
	if want := redisresp.Bulk("5") + redisresp.Bulk("21600000"); !strings.HasPrefix(groups[0].Args, want) {
		t.Fatalf("args %q, want the window left: %q", groups[0].Args, want)
	}
}

// TestFlagArgs: the dry-run and check flags prefix the algorithm argument,
// together as "cd" (takeScript).
func TestFlagArgs(t *testing.T) {
	l := &rule.Layer{}
	Encode(l, config.Rule{Name: "x", Points: 12, Duration: 1500e6, Algorithm: limit.Sliding, DryRun: true})
	args := l.RedisArgs
	if want := "$2\r\n12\r\n$4\r\n1500\r\n$2\r\nd1\r\n$1\r\n0\r\n"; args != want {
		t.Fatalf("dry-run args %q, want %q", args, want)
	}

	if got, want := CheckArgs(args), "$2\r\n12\r\n$4\r\n1500\r\n$3\r\ncd1\r\n$1\r\n0\r\n"; got != want {
		t.Fatalf("check args %q, want %q", got, want)
	}
}
