package redisstore

import (
	"errors"
	"fmt"

	"github.com/tierlimit/tierlimit/memstore"
	"github.com/tierlimit/tierlimit/redisresp"
)

// Spend charges cost to each of c's layers whatever its points: the part of
// a response's cost beyond what its request reserved (../meter.go). In
// Redis, one refund call of -cost per layer, which starts a window that is
// gone with the charge; to the synced counters, from the lease and the rest
// pending. Memory takes it too, whatever Redis does: it mirrors Redis's
// counts (GiveBack), or holds the charge itself while Redis is down or when
// the call fails, owed to Redis as the fallback's charges are (owed.go).
func Spend(s *RedisStore, c *charge, cost int64) {
	if s.Synced != nil {
		syncSpend(s.Synced, c, cost)
		return
	}

	memstore.Spend(s.Local, c, cost)

	if !s.Backend.Down.Load() {
		err := spendOnRedis(s, c, cost)
		if err == nil || errors.Is(err, redisresp.ErrClosed) {
			return
		}

		s.Backend.Failed(c.Now, false, fmt.Errorf("charging a reported cost: %w", err))
	}

	oweCharged(s, &tally{Cost: cost}, c)
}

// spendOnRedis adds cost to each of c's layers in Redis, a window that is
// gone started with its whole duration.
func spendOnRedis(s *RedisStore, c *charge, cost int64) error {
	for i, l := range c.Layers {
		ttl := int64(0)
		if l.Interval == 0 {
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
func syncSpend(st *SyncState, ch *charge, cost int64) {
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
