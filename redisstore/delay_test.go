package redisstore

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/config"
	"github.com/tierlimit/tierlimit/redisresp"
	"github.com/tierlimit/tierlimit/rule"
)

// TestTheScriptReservesAPlaceWithinMaxDelay: the script itself answers the
// wait. For each algorithm, ip with a maxDelay (2 per 10s) after a global
// layer of 3: the first two fit at once; the third waits for its place,
// reserved in Redis (the key changed) and answered as an odd reply (the
// tally's Wait, WaitBit set); the fourth, which ip would delay too, is
// refused by global, and Redis is left byte for byte as it was (ip's
// reservation undone with the rest); on ip alone it waits at least as long
// as the third, and the fifth, whose place is beyond maxDelay, is refused
// and changes nothing either.
func TestTheScriptReservesAPlaceWithinMaxDelay(t *testing.T) {
	addr, admin := redisServer(t)

	for _, c := range []struct {
		name  string
		ip    config.LayerConfig
		age   bool // a fixed window: 5s left after the first two
		third time.Duration
	}{
		{"tokenbucket", config.LayerConfig{Points: 2, Duration: "10s", Algorithm: "tokenbucket", Burst: 2, MaxDelay: "12s"}, false, 5 * time.Second},
		{"sliding", config.LayerConfig{Points: 2, Duration: "10s", Algorithm: "sliding", MaxDelay: "16s"}, false, 10*time.Second + time.Millisecond},
		{"fixed", config.LayerConfig{Points: 2, Duration: "10s", MaxDelay: "9s"}, true, 5 * time.Second},
	} {
		h, _ := newStoreHarness(t, addr, func(cfg *config.Config) {
			asACLUser(cfg)
			cfg.Global = config.LayerConfig{Points: 3, Duration: "1h"}
			cfg.IP = c.ip
		})
		s := h.store
		const client = "203.0.113.5"

		for i := 0; i < 2; i++ {
			if tl := takeIn(s, h.clock.Now().UnixNano(), h.layers, client); tl.Refused || tl.Wait != 0 {
				t.Fatalf("%s: request %d: %+v, want allowed at once", c.name, i+1, tl)
			}
		}

		if c.age {
			redisDo(t, admin, "PEXPIRE", "ratelimit:"+s.Name+":ip:"+client, "5000")
		}

		before := serverState(t, admin)
		third := takeIn(s, h.clock.Now().UnixNano(), h.layers, client)
		if third.Refused || third.Firsts&rule.WaitBit == 0 || time.Duration(third.Wait) > c.third || time.Duration(third.Wait) < c.third-5*time.Second {
			t.Fatalf("%s: third: %+v, want allowed with a wait of about %v", c.name, third, c.third)
		}

		if serverState(t, admin) == before {
			t.Fatalf("%s: the third's place is not reserved in Redis", c.name)
		}

		// global refuses the fourth, which ip would delay: nothing changes.
		before = serverState(t, admin)
		if tl := takeIn(s, h.clock.Now().UnixNano(), h.layers, client); !tl.Refused || tl.Wait != 0 || tl.Shown != 0 {
			t.Fatalf("%s: fourth: %+v, want refused by global without a wait", c.name, tl)
		}

		if after := serverState(t, admin); after != before {
			t.Fatalf("%s: the fourth, refused by global, changed Redis:\n%s\nto\n%s", c.name, before, after)
		}

		// ip alone: the fourth's place, no earlier than the third's (less
		// the time Redis's clock has run); the fifth's beyond maxDelay,
		// refused, changing nothing.
		if tl := takeIn(s, h.clock.Now().UnixNano(), h.layers[1:], client); tl.Refused || tl.Wait < third.Wait-int64(time.Second) {
			t.Fatalf("%s: fourth on ip: %+v, want a wait of at least the third's %v", c.name, tl, time.Duration(third.Wait))
		}

		before = serverState(t, admin)
		if tl := takeIn(s, h.clock.Now().UnixNano(), h.layers[1:], client); !tl.Refused || tl.Wait != 0 {
			t.Fatalf("%s: fifth: %+v, want refused beyond maxDelay", c.name, tl)
		}

		if after := serverState(t, admin); after != before {
			t.Fatalf("%s: the fifth, beyond maxDelay, changed Redis:\n%s\nto\n%s", c.name, before, after)
		}
	}
}

// TestAReplyWithAWaitNoLayerAllowsIsABadReply: the wait at the end of an
// odd reply (recordOdd) is believed only up to the longest maxDelay of the
// request's layers: a longer one, a negative one or a reply of the wrong
// length is a bad reply (the request is then decided in memory), never a
// request held for as long as the reply says.
func TestAReplyWithAWaitNoLayerAllowsIsABadReply(t *testing.T) {
	addr, _ := redisServer(t)
	h, _ := newStoreHarness(t, addr, func(cfg *config.Config) {
		asACLUser(cfg)
		cfg.Global = config.LayerConfig{Points: 3, Duration: "1h"}
		cfg.IP = config.LayerConfig{Points: 2, Duration: "10s", Algorithm: "tokenbucket", Burst: 2, MaxDelay: "12s"}
	})
	c := chargeOf(h.layers, "203.0.113.6", h.clock.Now().UnixNano())

	var ok rule.Tally
	if err := Record(h.store, &ok, c, []int64{1, 1000, 2, 5000, 12000}); err != nil || ok.Wait != int64(12*time.Second) || ok.Firsts&rule.WaitBit == 0 {
		t.Fatalf("a wait of maxDelay: %v, %+v; want it recorded", err, ok)
	}

	for _, ints := range [][]int64{
		{1, 1000, 2, 5000, 12001},      // beyond ip's maxDelay
		{1, 1000, 2, 5000, -1},         // negative
		{1, 1000, 2, 5000, 100, 100},   // one layer too many
		{1, 1000, 2, 5000, 1, 1, 2000}, // three layers of two
		{7000},                         // a wait alone
	} {
		var tl rule.Tally
		if err := Record(h.store, &tl, c, ints); !errors.Is(err, ErrBadReply) {
			t.Errorf("reply %v: %v, %+v; want ErrBadReply", ints, err, tl)
		}
	}
}

// TestACalendarPlaceIsInTheNextPeriodsKey: a daily quota of 2 with a
// maxDelay of an hour, 30 minutes before the day ends (the instance's
// clock, as a calendar's periods always are): the third request is charged
// to the next day's key, whose start its name carries, and waits the 30
// minutes; the day's own key keeps its 2. Giving the third's charge back
// (its client gone) takes it off the next day's key, not the day's. Half an
// hour earlier, the day's end beyond the maxDelay, the same request is
// refused and names no next key.
func TestACalendarPlaceIsInTheNextPeriodsKey(t *testing.T) {
	addr, admin := redisServer(t)
	h, _ := newStoreHarness(t, addr, func(cfg *config.Config) {
		asACLUser(cfg)
		cfg.IP = config.LayerConfig{Points: 2, Calendar: "day", MaxDelay: "1h"}
	})
	s := h.store
	const client = "203.0.113.11"

	now := h.clock.Now()
	end := time.Date(now.Year(), now.Month(), now.Day()+1, 0, 0, 0, 0, time.UTC)
	h.clock.Add(end.Sub(now) - 90*time.Minute)
	day := "ratelimit:" + s.Name + ":ip:" + client + ":" + formatInt(end.Add(-24*time.Hour).Unix())
	next := "ratelimit:" + s.Name + ":ip:" + client + ":" + formatInt(end.Unix())

	for i := 0; i < 2; i++ {
		if tl := takeIn(s, h.clock.Now().UnixNano(), h.layers, client); tl.Refused || tl.Wait != 0 {
			t.Fatalf("request %d: %+v, want allowed at once", i+1, tl)
		}
	}

	if tl := takeIn(s, h.clock.Now().UnixNano(), h.layers, client); !tl.Refused {
		t.Fatalf("90 minutes before the day's end: %+v, want refused", tl)
	}

	h.clock.Add(time.Hour)
	c := h.charge(client, h.clock.Now().UnixNano())

	var third rule.Tally
	Take(s, &third, c)
	if third.Refused || third.Wait != int64(30*time.Minute) {
		t.Fatalf("third: %+v, want allowed with a wait of 30m", third)
	}

	if got, want := counts(t, admin, day, next), "2 1"; got != want {
		t.Fatalf("the day's and the next day's keys: %s, want %s", got, want)
	}

	Refund(s, c, 1)

	if got, want := counts(t, admin, day, next), "2 0"; got != want {
		t.Fatalf("after the third's give-back: %s, want %s", got, want)
	}
}

// counts are the values of keys, space-separated ("-" for a key that does
// not exist).
func counts(t *testing.T, admin *redisresp.Pool, keys ...string) string {
	var out []string

	for _, v := range redisDo(t, admin, append([]string{"MGET"}, keys...)...).Array {
		if v.Null {
			out = append(out, "-")
			continue
		}

		out = append(out, v.Str)
	}

	return strings.Join(out, " ")
}
