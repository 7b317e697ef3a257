package redisstore

import (
	"errors"
	"fmt"
	"strconv"
	"sync"

	"github.com/tierlimit/tierlimit/limit"
	"github.com/tierlimit/tierlimit/memstore"
	"github.com/tierlimit/tierlimit/redisresp"
	"github.com/tierlimit/tierlimit/rule"
)

// What the memory fallback admits during an outage is added to Redis when
// Redis answers again, so that a flap does not split a key's count between
// the two stores and let their sum through: memory starts from what Redis
// last reported (fallback.go), and Redis then takes what memory charged.
// A key Redis still holds is added to; a fixed or sliding key that Redis
// lost (a restart without persistence) is created with the charges, to the
// end of the window memory holds for it, so that the outage's charges are
// counted after an empty restart too. A key whose memory window ended is not
// started again. At most maxTracked keys per middleware. A token bucket is
// charged its outage tokens from where Redis holds it, or from the present
// when it is full.
// A payment that fails keeps what it did not pay for the next recovery: a
// call that timed out after Redis ran it is then paid twice, which refuses
// early, never late.

// OwedKey is one layer's key whose outage charges Redis is owed: the layer
// and its key, as rule.KeyFor made it (what Redis and memory count by), and
// for a calendar layer the start of the period the charges count in
// (owedPeriod), which its Redis key names: a maxDelay may place a charge in
// the next period, another key.
type OwedKey struct {
	L      *rule.Layer
	Key    string
	Period int64
}

// owedDebt is what Redis is owed for one key: points, and the time of the
// last charge (a calendar key is paid at it, or at its OwedKey.Period's
// start when that is later: payDebt).
type owedDebt struct {
	Points int64
	at     int64
}

// owedCounts is a Redis store's debts, under mu.
type owedCounts struct {
	Mu     sync.Mutex
	Debts  map[OwedKey]owedDebt
	max    int
	listed bool // the backend pays them when it recovers (redisBackend.oweOnRecovery)
}

func newOwedCounts(max int) *owedCounts {
	return &owedCounts{Debts: map[OwedKey]owedDebt{}, max: max}
}

// oweCharged records what a take in the fallback charged, while Redis is
// down: a call that failed for another reason (a busy pool, a replaced
// configuration) leaves no outage to recover from.
func oweCharged(s *RedisStore, t *rule.Tally, c *rule.Charge) {
	if !s.Backend.Down.Load() {
		return
	}

	cost := rule.CostOf(t)
	keys := owedKeys(s, c)
	o := s.Owed

	o.Mu.Lock()
	for i, l := range c.Layers {
		if l.CheckOnly || l.Alg == algConcurrency || t.Uncharged&(uint64(1)<<uint(i)) != 0 {
			continue
		}

		addDebt(o, keys[i], owedDebt{Points: cost, at: c.Now})
	}
	o.Mu.Unlock()

	listOwed(s)
}

// addDebt adds d to k's debt, at the later of their times; past max keys a
// new one is not taken. Called with o.mu held.
func addDebt(o *owedCounts, k OwedKey, d owedDebt) {
	cur, ok := o.Debts[k]
	if !ok && len(o.Debts) >= o.max {
		return
	}

	if cur.at > d.at {
		d.at = cur.at
	}

	d.Points += cur.Points
	o.Debts[k] = d
}

// listOwed has the backend pay the store's debts at its next recovery,
// once however many debts there are.
func listOwed(s *RedisStore) {
	o := s.Owed

	o.Mu.Lock()
	register := !o.listed && len(o.Debts) > 0
	if register {
		o.listed = true
	}
	o.Mu.Unlock()

	if register {
		s.Backend.oweOnRecovery(func() { PayOwed(s) })
	}
}

// owedKeys are the debts' keys of c's layers, taken before the debts' lock
// (owedPeriod takes memory's).
func owedKeys(s *RedisStore, c *rule.Charge) []OwedKey {
	keys := make([]OwedKey, len(c.Layers))
	for i, l := range c.Layers {
		keys[i] = OwedKey{L: l, Key: c.Keys[i]}
		if l.Calendar != 0 {
			keys[i].Period = owedPeriod(s.Local, l, c.Keys[i], c.Now)
		}
	}

	return keys
}

// owedPeriod is the start of the calendar period that the fallback's charge
// of key in l at now counts in: now's, or, with a maxDelay, a later one
// where memory's window of the key starts (the place it reserved).
func owedPeriod(s *memstore.WindowStore, l *rule.Layer, key string, now int64) int64 {
	at := now
	if l.MaxDelay > 0 {
		s.Mu.Lock()
		if w := s.Maps[l.Name][key]; w != nil && w.Start > now {
			at = w.Start
		}
		s.Mu.Unlock()
	}

	start, _ := limit.Period(at, l.Calendar, l.UtcOffset)

	return start
}

// forgiveRefunded takes back from the debts what a refund during the
// outage gave memory back.
func forgiveRefunded(s *RedisStore, c *rule.Charge, cost int64) {
	keys := owedKeys(s, c)
	o := s.Owed

	o.Mu.Lock()
	for i := range c.Layers {
		k := keys[i]
		if d, ok := o.Debts[k]; ok {
			d.Points -= cost
			if d.Points > 0 {
				o.Debts[k] = d
			} else {
				delete(o.Debts, k)
			}
		}
	}
	o.Mu.Unlock()
}

// PayOwed adds the debts to Redis, a refund of a negative cost per key: the
// refund script adds to a key that exists, and creates a missing one that
// memory still holds a window of (payDebt).
func PayOwed(s *RedisStore) {
	o := s.Owed

	o.Mu.Lock()
	debts := o.Debts
	o.Debts = map[OwedKey]owedDebt{}
	o.listed = false
	o.Mu.Unlock()

	var unpaid map[OwedKey]owedDebt

	closed := false

	for k, d := range debts {
		if unpaid == nil {
			err := payDebt(s, k, d)
			if err == nil {
				continue
			}

			closed = errors.Is(err, redisresp.ErrClosed)
			if !closed {
				s.Backend.Failed(s.Clock().UnixNano(), false, fmt.Errorf("adding what the memory fallback charged: %w", err))
			}

			unpaid = map[OwedKey]owedDebt{}
		}

		unpaid[k] = d
	}

	switch {
	case unpaid == nil:
	case closed:
		oweReplaced(s, unpaid)
	default:
		oweAgain(s, unpaid)
	}
}

// oweReplaced hands what a replaced configuration's store, whose pool is
// closed, still owes Redis to the newest store of its name (spend.go),
// which pays at once, or at its own recovery; none when the name counts
// in memory now, which holds the charges already.
func oweReplaced(s *RedisStore, unpaid map[OwedKey]owedDebt) {
	n := successor(s)
	if n == nil {
		return
	}

	o := n.Owed

	o.Mu.Lock()
	for k, d := range unpaid {
		addDebt(o, k, d)
	}
	o.Mu.Unlock()

	if n.Backend.Down.Load() {
		listOwed(n)
		return
	}

	PayOwed(n)
}

// payDebt adds one key's debt to Redis. A fixed or sliding key is given the
// milliseconds left in memory's window of it, which the refund script
// creates the key with when Redis lost it.
func payDebt(s *RedisStore, k OwedKey, d owedDebt) error {
	ttl := int64(0)
	if k.L.Alg != algTokenBucket {
		ttl = windowLeft(s.Local, k.L, k.Key, s.Clock().UnixNano())
	}

	at := d.at
	if at < k.Period {
		at = k.Period // charges placed in a later period (owedPeriod)
	}

	return addOnRedis(s, k.L, k.Key, d.Points, ttl, at)
}

// addOnRedis adds points to l's key in Redis, whatever its points: a refund
// of -points, which creates a fixed or sliding key that is gone with ttl
// milliseconds to live (none when 0), and a token bucket that is gone or
// full from now. at is the time of the charge (a calendar key names its
// period).
func addOnRedis(s *RedisStore, l *rule.Layer, key string, points, ttl, at int64) error {
	tail := redisresp.Bulk(strconv.FormatInt(ttl, 10))
	call := refundRedis.Call(1, 7)

	c := &rule.Charge{Layers: []*rule.Layer{l}, Keys: []string{key}, Now: at}
	if cl := s.Backend.cluster; cl != nil {
		g := slotGroups(c, CostArg(-points))[0]
		replies, err := cl.RunInts([]redisresp.ClusterCall{{Slot: g.slot, Call: call, Encoded: g.Keys + g.Args + tail}})
		if err == nil && len(replies) == 1 && replies[0].ServerErr != "" {
			err = errors.New("running the refund script: " + replies[0].ServerErr)
		}

		return err
	}

	encoded := EncodeCall(c, "", -points)

	_, serverErr, err := call.RunIntsOn(s.Backend.Pool, encoded+tail)
	if err == nil && serverErr != "" {
		err = errors.New("running the refund script: " + serverErr)
	}

	return err
}

// windowLeft is the milliseconds left at now in memory's window of key in
// l, rounded up (limit.CeilMillis), or 0 when memory holds none that is
// live.
func windowLeft(s *memstore.WindowStore, l *rule.Layer, key string, now int64) int64 {
	s.Mu.Lock()
	defer s.Mu.Unlock()

	w := s.Maps[l.Name][key]
	if w == nil || w.Reset <= now {
		return 0
	}

	return limit.CeilMillis(w.Reset - now)
}

// oweAgain puts back the debts a payment could not pay, with what the
// fallback charged since, for the next recovery.
func oweAgain(s *RedisStore, unpaid map[OwedKey]owedDebt) {
	o := s.Owed

	o.Mu.Lock()
	for k, d := range unpaid {
		addDebt(o, k, d)
	}
	o.Mu.Unlock()

	listOwed(s)
}

// oweOnRecovery runs pay once Redis answers again (succeeded).
func (b *RedisBackend) oweOnRecovery(pay func()) {
	b.Mu.Lock()
	b.debts = append(b.debts, pay)
	b.Mu.Unlock()
}

// payDebts runs the payments of a recovery, off the request that probed.
func payDebts(debts []func()) {
	defer func() { _ = recover() }()

	for _, pay := range debts {
		pay()
	}
}
