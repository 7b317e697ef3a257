package redisstore

import (
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/tierlimit/tierlimit/limit"
	"github.com/tierlimit/tierlimit/memstore"
	"github.com/tierlimit/tierlimit/redisresp"
	"github.com/tierlimit/tierlimit/rule"
)

// RedisStore keeps the counters in Redis, shared by every Traefik instance,
// with keys <keyPrefix>:<middleware name>:<layer>:<key>. When Redis fails or is
// slower than redis.timeout, local (the middleware's memory store, same limits)
// decides instead, and Redis is skipped during a back-off. Keys that Redis
// reported over their limit are refused locally until their reset.
type RedisStore struct {
	Prefix  string
	Name    string // the middleware's, and the channel of its resets (resetsub.go)
	Channel string
	Backend *RedisBackend
	Local   *memstore.WindowStore
	// Blocks: a layer has a blockDuration, so that the fallback decides
	// with blocks (memstore.TakeWithBlocks) when Redis cannot (takeLocal).
	Blocks  bool
	Blocked *BlockList
	Owed    *owedCounts      // what the fallback charged during an outage (owed.go)
	Clock   func() time.Time // the instance's (Plugin.now), for what no request times: a reset from another replica
	Calls   []redisresp.Call // the script's call head by number of layers
	Synced  *SyncState       // redis.syncInterval's counters (syncstore.go); nil: exact mode
	// Exact: with Synced, the store that counts the concurrency layers in
	// Redis exactly, beside the synced layers (slots.go): this store with
	// no Synced; nil when no concurrency layer is counted in Redis.
	Exact *RedisStore
}

// CallFor returns the script's call head for n layers.
func CallFor(s *RedisStore, n int) redisresp.Call {
	if n < len(s.Calls) {
		return s.Calls[n]
	}

	return takeCall(n)
}

// Take charges c's layers in Redis, all or nothing, in one script call (or
// to the synced counters, or to the fallback when Redis is down or fails),
// and writes the outcome to t. The healthy path (nothing blocked, Redis up)
// takes no lock and makes as few calls as it can (../doc.go: frames).
func Take(s *RedisStore, t *rule.Tally, c *rule.Charge) {
	if s.Synced != nil {
		takeSynced(s, t, c)
		return
	}

	// No layer to charge (an anonymous request to an instance with only
	// principal tiers, a credentialed one with global off, a request that
	// matches none of a routes-only instance's routes): nothing to ask Redis.
	if len(c.Layers) == 0 {
		t.Shown = -1
		return
	}

	if !c.All && s.Blocked.Size.Load() != 0 && s.TakeBlocked(t, c) {
		return
	}

	// Only the back-off's probe ends an outage (UseNow; ../events/redisevents.go):
	// a call in flight when Redis failed may still succeed.
	if s.Backend.Down.Load() && !UseNow(s.Backend, c.Now) {
		s.TakeLocal(t, c)
		return
	}

	if err := takeInRedis(s, t, c); err != nil {
		// A closed pool is not Redis failing: this instance belongs to a
		// configuration that was replaced, and its backend was released. Nor
		// is a pool that stayed busy for redisresp.DefaultWaitTimeout: the
		// calls ahead of this one were answered.
		if !errors.Is(err, redisresp.ErrClosed) && !errors.Is(err, redisresp.ErrPoolTimeout) {
			s.Backend.Failed(c.Now, false, err)
		}

		*t = rule.Tally{Cost: t.Cost, Each: t.Each}
		s.TakeLocal(t, c)
	}
}

// TakeLocal decides the request in memory, Redis being down or failing.
// A key Redis blocked is refused before (takeBlocked); a blockDuration
// refusal here starts a block in memory, and on the block list, so that
// it refuses the key for the rest of the block after Redis is back too.
func (s *RedisStore) TakeLocal(t *rule.Tally, c *rule.Charge) {
	memstore.TakeWithBlocks(s.Local, s.Blocks, t, c)

	if !t.Refused || c.All {
		oweCharged(s, t, c)
	}

	if !t.Refused || c.All || t.Shown < 0 || c.Layers[t.Shown].BlockDuration == 0 {
		return
	}

	l := c.Layers[t.Shown]
	key := c.Keys[t.Shown]
	first := s.Blocked.Add(l.BlockPrefix, key, t.Reset, c.Now)
	if first {
		ListenResets(s)
	}

	s.Blocked.hit(l.BlockPrefix, key, first)
}

// TakeBlocked refuses the request locally when one of its keys is known to be
// over its limit, and reports whether it did. A key is blocked until the
// smallest cost fits again (redisStore.refused); a larger one refuses too,
// but in a sliding window or a token bucket it fits later than that, so
// such a request asks Redis, which tells when. So does a request to a layer
// with a maxDelay once the key's reset is within it: Redis reserves its
// place, which it then waits for.
func (s *RedisStore) TakeBlocked(t *rule.Tally, c *rule.Charge) bool {
	costly := t.Cost > 1

	for i, l := range c.Layers {
		if costly && t.Cost > l.MinCost && l.BlockDuration == 0 && limit.Gradual(l.Algorithm) {
			continue
		}

		if reset := s.Blocked.ResetOf(l.BlockPrefix, c.Keys[i], c.Now); reset != 0 && !limit.Within(reset-c.Now, l.MaxDelay) {
			rule.CountRedis(l.Stats, true)
			if l.BlockDuration != 0 {
				s.Blocked.hit(l.BlockPrefix, c.Keys[i], false)
			}

			*t = rule.Tally{Shown: i, Count: l.Capacity + 1, Reset: reset, Refused: true,
				ResetH: []string{strconv.FormatInt(limit.CeilSeconds(reset), 10)}}

			return true
		}
	}

	return false
}

// takeInRedis runs the script and writes its outcome to t; on an error, t is
// to be discarded.
func takeInRedis(s *RedisStore, t *rule.Tally, c *rule.Charge) error {
	mode := ArgStopAtRefusal
	if c.All {
		mode = argChargeAll
	}

	// A cluster takes one call per slot (a cluster's DoInts fails at once).
	var ints []int64
	var serverErr string
	var err error

	cost := rule.CostOf(t)

	if s.Backend.cluster != nil {
		ints, serverErr, err = s.runCluster(s.Backend.cluster, c, cost)
	} else {
		ints, serverErr, err = CallFor(s, len(c.Layers)).RunIntsOn(s.Backend.Pool, EncodeCall(c, mode, cost))
	}

	if err != nil {
		return err
	}

	if serverErr != "" {
		return fmt.Errorf("running the rate-limit script: %s", serverErr)
	}

	return Record(s, t, c, ints)
}

// Refund gives back a request's charge of cost to layers, a charge that a
// later refusal of the same request voids (the up-front global charge of a
// credentialed request whose ip charge is refused, the other layers of a
// request a costFrom route refuses, a place whose client went away while
// waiting): GiveBack, with each concurrency layer's slot of c's lease, and
// the key of a layer with a maxDelay no longer blocked (unblockPlaces).
func Refund(s *RedisStore, c *rule.Charge, cost int64) {
	if s.Blocked.Size.Load() != 0 {
		unblockPlaces(s, c)
	}

	GiveBack(s, c, cost, false)
}

// GiveBack is every give-back of the Redis store, so that Redis and its
// memory mirror (the counts Redis reported to this process and the slots it
// holds there: what the status page, the metrics and the fallback read)
// never part: the refund of cost to c's layers (slots false), or the release
// of the slots c's request holds in its concurrency layers once it has been
// served (slots true: in memory, layers counted there too, the fallback's
// and the mirror's; in Redis one call removes its member from each key, a
// call per key on a cluster). Memory gives back first, whatever Redis does: it mirrors Redis,
// or while Redis is in back-off it holds the charge itself (then owed to
// Redis no more, forgiveRefunded). Redis then gives back the same: cost off
// each counter, c's lease's member off each concurrency key. A call that
// fails is not retried: a count stays cost too high in Redis until its
// window ends, the bound docs/redis.md states; but the slots of c's lease
// that Redis could not free (down, or the call failed) it frees when it
// answers again (oweRelease), so that a key with nothing in flight is not
// refused there until their leases end. Synced counters hold no slot and
// keep their own counts (syncRefund).
func GiveBack(s *RedisStore, c *rule.Charge, cost int64, slots bool) {
	if slots {
		memstore.Release(s.Local, c)
	} else if s.Synced == nil {
		memstore.Refund(s.Local, c, cost)
	}

	giveBackInRedis(s, c, cost, slots)
}

// giveBackInRedis is GiveBack's Redis part, which a store whose pool a
// reload closed hands to its successor (giveBackReplaced). Rare cases are
// in functions of their own (../doc.go: frames): a release is on every
// request of a concurrency layer.
func giveBackInRedis(s *RedisStore, c *rule.Charge, cost int64, slots bool) {
	var err error

	switch {
	case s.Synced != nil || s.Backend.Down.Load():
		giveBackAway(s, c, cost, slots)
	case slots:
		if c.Lease != "" {
			err = releaseInRedis(s, c)
		}
	case len(c.Layers) != 0:
		err = refundOnRedis(s, c, cost)
	}

	if err != nil {
		gaveBackFailed(s, c, cost, slots, err)
	}
}

// unblockPlaces lets the keys of c's layers with a maxDelay ask Redis again
// once c's charge is given back (a client gone while waiting): a refusal
// blocked such a key until its place would come within the maxDelay
// (TakeBlocked), but the place given back may be nearer, and is the next
// request's, as in memory. A blockDuration's block stays.
func unblockPlaces(s *RedisStore, c *rule.Charge) {
	for i, l := range c.Layers {
		if l.MaxDelay > 0 && l.BlockDuration == 0 {
			s.Blocked.Forget(l.BlockPrefix+c.Keys[i], c.Now)
		}
	}
}

// giveBackAway is GiveBack's Redis part for synced counters, or while Redis
// is in back-off: memory held the charge, which Redis is owed no more.
func giveBackAway(s *RedisStore, c *rule.Charge, cost int64, slots bool) {
	if s.Synced != nil {
		if s.Exact != nil && anyUnleased(c) {
			giveBackUnleased(s, c, cost, slots)
			return
		}

		if !slots {
			syncRefund(s.Synced, c, cost)
		}

		return
	}

	if !slots {
		forgiveRefunded(s, c, cost)
	}

	oweRelease(s, c)
}

// gaveBackFailed handles a give-back that Redis failed: an outage starts
// (a busy pool is none), and the slots are owed to the recovery; a pool a
// reload closed hands the give-back to the newest store of the name
// (giveBackReplaced).
func gaveBackFailed(s *RedisStore, c *rule.Charge, cost int64, slots bool, err error) {
	if errors.Is(err, redisresp.ErrClosed) {
		giveBackReplaced(s, c, cost, slots)
		return
	}

	if !errors.Is(err, redisresp.ErrPoolTimeout) {
		s.Backend.Failed(s.Clock().UnixNano(), false, fmt.Errorf("giving back a request's charge: %w", err))
	}

	oweRelease(s, c)
}

// refundOnRedis runs the refund script of cost for layers in Redis (a
// negative cost adds to the keys that exist).
func refundOnRedis(s *RedisStore, c *rule.Charge, cost int64) error {
	if s.Backend.cluster != nil {
		return s.refundCluster(s.Backend.cluster, c, cost)
	}

	_, serverErr, err := refundRedis.Call(len(c.Layers), 5*len(c.Layers)+1).RunIntsOn(s.Backend.Pool, EncodeCall(c, "", cost))
	if err == nil && serverErr != "" {
		err = fmt.Errorf("running the refund script: %s", serverErr)
	}

	return err
}

// refused records that layers[i] refused with count: the key is blocked
// locally until reset, and the first refusal per window is reported. It
// reports whether the request is refused, so that takeRedis can tell a
// reply that goes on after it: not by a dry-run layer, which blocks nothing.
//
// A key is blocked only by a refusal of the smallest cost the layer is
// charged (layer.minCost): then every request to it would be refused until
// reset, whatever its cost. A key that refused a larger cost (an export of
// cost 10) may still take a smaller one (a plain read), so that refusal
// blocks nothing and the next such request asks Redis again; the block list
// only remembers it was reported (blockList.note).
func (s *RedisStore) refused(t *rule.Tally, c *rule.Charge, i int, count, reset int64) bool {
	l, key, now := c.Layers[i], c.Keys[i], c.Now

	first := false
	// A layer whose counts may fall blocks nothing: a concurrency slot may
	// free at once, a costFrom route's settlement may give points back.
	if !l.DryRun && l.Alg != algConcurrency && !l.Settles && (t.Cost <= 1 || t.Cost <= l.MinCost || l.BlockDuration != 0) {
		first = s.Blocked.Add(l.BlockPrefix, key, reset, now)
		if first {
			ListenResets(s)
		}

		if l.BlockDuration != 0 {
			s.Blocked.hit(l.BlockPrefix, key, first)
		}
	} else {
		first = s.Blocked.note(l.BlockPrefix, key, reset, now)
	}

	return rule.RefuseAs(t, i, l, count, reset, []string{strconv.FormatInt(limit.CeilSeconds(reset), 10)}, first)
}
