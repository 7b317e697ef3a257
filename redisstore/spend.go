package redisstore

import (
	"errors"
	"fmt"
	"sync"

	"github.com/tierlimit/tierlimit/memstore"
	"github.com/tierlimit/tierlimit/redisresp"
	"github.com/tierlimit/tierlimit/rule"
)

// Spend charges cost to each of c's layers whatever its points: the part of
// a response's cost beyond what its request reserved (../meter.go). In
// Redis, one refund call of -cost per layer, which starts a window that is
// gone with the charge; to the synced counters, from the lease and the rest
// pending. Memory takes it too, whatever Redis does: it mirrors Redis's
// counts (GiveBack), or holds the charge itself while Redis is down or when
// the call fails, owed to Redis as the fallback's charges are (owed.go).
func Spend(s *RedisStore, c *rule.Charge, cost int64) {
	if s.Synced != nil {
		syncSpend(s.Synced, c, cost)
		return
	}

	memstore.Spend(s.Local, c, cost)

	if !s.Backend.Down.Load() {
		err := spendOnRedis(s, c, cost)
		if err == nil {
			return
		}

		if errors.Is(err, redisresp.ErrClosed) {
			spendReplaced(s, c, cost)
			return
		}

		s.Backend.Failed(c.Now, false, fmt.Errorf("charging a reported cost: %w", err))
	}

	oweCharged(s, &rule.Tally{Cost: cost}, c)
}

// spendOnRedis adds cost to each of c's layers in Redis, a window that is
// gone started with its whole duration.
func spendOnRedis(s *RedisStore, c *rule.Charge, cost int64) error {
	for i, l := range c.Layers {
		ttl := int64(0)
		if l.Alg != algTokenBucket {
			ttl = l.Duration / NsPerMillisecond
		}

		if err := addOnRedis(s, l, c.Keys[i], cost, ttl, c.Now); err != nil {
			return err
		}
	}

	return nil
}

// syncSpend charges cost to the charge's counters whatever their points:
// from the lease, and the rest pending, which the next call adds to Redis.
func syncSpend(st *SyncState, ch *rule.Charge, cost int64) {
	st.Mu.Lock()

	for i, l := range ch.Layers {
		if l.CheckOnly {
			continue
		}

		c := syncCounterFor(st, l, ch.Keys[i], ch.Now)
		if c.Lease >= cost {
			c.Lease -= cost
		} else {
			c.Pending += cost - c.Lease
			c.Lease = 0
		}

		c.Touched = true
	}

	st.Mu.Unlock()
}

// A request may outlive its configuration by more than the release grace
// (../lifetime/lifetime.go): a stream of minutes across a reload. When the
// reload changed a redis setting (a rotated password, a timeout), the old
// backend's pool is closed at the grace, and what the request settles or
// releases after its response (a reported cost, a concurrency slot) would
// find it closed. It goes instead to the newest store of the same
// middleware name, which counts in the same keys; when the name now counts
// in memory (or is configured no more), to its memory store, which the
// counters of the name live in across reloads. Nothing a request settles is
// dropped for a closed pool; nothing on the request path pays for this
// (only a call that failed with redisresp.ErrClosed looks).

// current holds the newest Redis store of each middleware name (SetCurrent).
var current sync.Map

// SetCurrent makes s the newest Redis store of its middleware name, or,
// with s nil, records that name counts in memory now. New calls it.
func SetCurrent(name string, s *RedisStore) {
	if s == nil {
		current.Delete(name)
		return
	}

	current.Store(name, s)
}

// successor is the store that settles in place of s, whose pool is
// closed: the newest store of s's name when it is another on another
// backend, else nil (memory then: s.Local).
func successor(s *RedisStore) *RedisStore {
	v, ok := current.Load(s.Name)
	if !ok {
		return nil
	}

	n, _ := v.(*RedisStore)
	if n == nil || n == s || n.Backend == s.Backend {
		return nil
	}

	return n
}

// spendReplaced is the Redis part of Spend of a store whose pool is closed
// (memory, shared by the name's stores, took the cost already): the
// successor's Redis, or its fallback's debts while it is down.
func spendReplaced(s *RedisStore, c *rule.Charge, cost int64) {
	n := successor(s)
	switch {
	case n == nil:
	case n.Synced != nil:
		syncSpend(n.Synced, c, cost)
	case n.Backend.Down.Load():
		oweCharged(n, &rule.Tally{Cost: cost}, c)
	default:
		if err := spendOnRedis(n, c, cost); err != nil {
			n.Backend.Failed(c.Now, false, fmt.Errorf("charging a reported cost: %w", err))
			oweCharged(n, &rule.Tally{Cost: cost}, c)
		}
	}
}

// giveBackReplaced is the Redis part of GiveBack of a store whose pool is
// closed (memory, shared by the name's stores, gave back already). With no
// successor on Redis, the name no longer counts in Redis: the counts' windows
// and the slots' leases end them there.
func giveBackReplaced(s *RedisStore, c *rule.Charge, cost int64, slots bool) {
	if n := successor(s); n != nil {
		giveBackInRedis(n, c, cost, slots)
	}
}
