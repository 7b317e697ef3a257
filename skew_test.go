package tierlimit

import (
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/redisresp"
)

// Replicas whose clocks disagree, on one real redis-server: what one
// replica writes must never let another, whose clock is behind, count a
// window again from zero.

// clockedReplicas are two replicas of one middleware on one Redis (conf on
// addr, the second with the first's keys, replicaOf), the first's clock
// ahead of the second's by skew.
func clockedReplicas(t *testing.T, addr string, conf func(c *Config), skew time.Duration) (ahead, behind *harness) {
	t.Helper()

	ahead, _ = redisHarness(t, addr, conf)
	behind, _ = redisHarness(t, addr, conf)
	replicaOf(ahead, behind)

	for _, h := range []*harness{ahead, behind} {
		if rs := h.p.stores.redis; rs.Synced != nil {
			st := rs.Synced
			st.Mu.Lock()
			st.Backend, st.Now = rs.Backend, h.clock.Now
			st.Mu.Unlock()
		}
	}

	ahead.clock.mu.Lock()
	ahead.clock.now = behind.clock.Now().Add(skew)
	ahead.clock.mu.Unlock()

	return ahead, behind
}

// setClock sets h's clock to at.
func setClock(h *harness, at time.Time) {
	h.clock.mu.Lock()
	h.clock.now = at
	h.clock.mu.Unlock()
}

// passTime lets d pass for the replicas and for Redis: each replica's clock
// moves on by d, and every key's TTL is shortened by d (a key with d or
// less left is deleted), as d of Redis's own time would. Redis's TIME does
// not move: use it for TTL-kept state (windows) only, or where a bucket
// refilling later than it would only refuses more.
func passTime(t *testing.T, admin *redisresp.Pool, d time.Duration, replicas ...*harness) {
	t.Helper()

	for _, h := range replicas {
		h.clock.Add(d)
	}

	ms := int64(d / time.Millisecond)
	for _, k := range redisDo(t, admin, "KEYS", "*").Array {
		ttl := redisDo(t, admin, "PTTL", k.Str).Int
		switch {
		case ttl > ms:
			redisDo(t, admin, "PEXPIRE", k.Str, strconv.FormatInt(ttl-ms, 10))
		case ttl > 0:
			redisDo(t, admin, "DEL", k.Str)
		}
	}
}

// sendN sends n requests of client to h and returns how many were allowed.
func sendN(h *harness, client string, n int) int {
	allowed := 0
	for i := 0; i < n; i++ {
		if h.get("/api", client+":1").Code == http.StatusOK {
			allowed++
		}
	}

	return allowed
}

// TestReplicasWithClocksApartNeverAdmitMoreThanThePoints: two replicas
// whose clocks are apart share a key of 10 points in Redis, late in its
// window (fixed windows aligned to the minute with syncInterval, calendar
// periods, exact and synced). The replica ahead gives the key a TTL that
// ends its window early on its own clock; after the one ahead is in its next
// window, the one behind asks again, 3 s before the end of its own. It never
// finds the key gone: over both, the window admits its 10 points. With
// clocks 5 s apart (within redisstore.KeyGrace) in any order; 30 s apart,
// once the replica behind has counted in the key. Windows that Redis times
// (fixed from the first hit, sliding, token buckets) hold as well.
func TestReplicasWithClocksApartNeverAdmitMoreThanThePoints(t *testing.T) {
	addr, admin := redisServer(t)
	minute := utc(2026, 6, 15, 10, 1, 0)

	rows := []struct {
		name  string
		layer LayerConfig
		end   time.Time // the end of the window the replica behind starts in
		sync  bool
	}{
		{"fixed", LayerConfig{Points: 10, Duration: "60s"}, minute, false},
		{"sliding", LayerConfig{Points: 10, Duration: "60s", Algorithm: "sliding"}, minute, false},
		{"tokenbucket", LayerConfig{Points: 1, Duration: "1h", Algorithm: "tokenbucket", Burst: 10}, minute, false},
		{"day", LayerConfig{Points: 10, Calendar: "day"}, utc(2026, 6, 16, 0, 0, 0), false},
		{"week", LayerConfig{Points: 10, Calendar: "week"}, utc(2026, 6, 22, 0, 0, 0), false},
		{"month", LayerConfig{Points: 10, Calendar: "month"}, utc(2026, 7, 1, 0, 0, 0), false},
		{"day+07:00", LayerConfig{Points: 10, Calendar: "day", UtcOffset: "+07:00"}, utc(2026, 6, 15, 17, 0, 0), false},
		{"synced fixed", LayerConfig{Points: 10, Duration: "60s"}, minute, true},
		{"synced day", LayerConfig{Points: 10, Calendar: "day"}, utc(2026, 6, 16, 0, 0, 0), true},
		{"synced month+07:00", LayerConfig{Points: 10, Calendar: "month", UtcOffset: "+07:00"}, utc(2026, 6, 30, 17, 0, 0), true},
	}

	// What the replicas send before the one ahead leaves the window, in
	// turn: the replica behind first (the one ahead then writes the key's
	// TTL from its clock), the one ahead alone (it makes the key; the one
	// behind comes only late in its window), or the one ahead, the one
	// behind, the one ahead.
	orders := []struct {
		name  string
		sends []int // requests of behind, ahead, behind, ... (0: none)
		apart []time.Duration
	}{
		{"behind first", []int{3, 10}, []time.Duration{5 * time.Second, 30 * time.Second}},
		{"ahead first", []int{0, 10}, []time.Duration{5 * time.Second}},
		{"ahead, behind, ahead", []int{0, 3, 3, 10}, []time.Duration{5 * time.Second, 30 * time.Second}},
	}

	for _, row := range rows {
		for _, order := range orders {
			for _, skew := range order.apart {
				conf := func(c *Config) {
					asACLUser(c)
					c.IP = row.layer
					if row.sync {
						c.Redis.SyncInterval = "1h"
					}
				}

				ahead, behind := clockedReplicas(t, addr, conf, skew)
				setClock(behind, row.end.Add(-skew-5*time.Second))
				setClock(ahead, row.end.Add(-5*time.Second))

				client := "203.0.113.50"
				allowed := 0
				for i, n := range order.sends {
					allowed += sendN([]*harness{behind, ahead}[i%2], client, n)
				}

				// The clock ahead is in its next window, the one behind 3 s
				// from the end of its own.
				passTime(t, admin, skew+2*time.Second, ahead, behind)
				allowed += sendN(behind, client, 10)

				if allowed != 10 {
					t.Errorf("%s, %s, clocks %v apart: %d admitted over two replicas, want the 10 points", row.name, order.name, skew, allowed)
				}
			}
		}
	}
}
