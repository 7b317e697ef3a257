package tierlimit

import (
	"errors"
	"fmt"
	"sync"

	"github.com/tierlimit/tierlimit/redisresp"
)

// What the memory fallback admits during an outage is added to Redis when
// Redis answers again, so that a flap does not split a key's count between
// the two stores and let their sum through: memory starts from what Redis
// last reported (fallback.go), and Redis then takes what memory charged.
// A key Redis still holds is added to; a fixed or sliding key that Redis
// lost (a restart without persistence) is created with the charges, to the
// end of the window memory holds for it, so that the outage's charges are
// counted after an empty restart too. A key whose memory window ended is not
// started again. At most maxTracked keys per middleware. A token bucket is charged its outage tokens from where Redis
// holds it, which is exact unless it filled up before the outage's charges.
// A payment that fails keeps what it did not pay for the next recovery: a
// call that timed out after Redis ran it is then paid twice, which refuses
// early, never late.

// owedKey is one layer's key whose outage charges Redis is owed: the layer
// and its key, as keyFor made it (what Redis and memory count by).
type owedKey struct {
	l   *layer
	key string
}

// owedDebt is what Redis is owed for one key: points, and the time of the
// last charge (a calendar key names the period that holds it).
type owedDebt struct {
	points int64
	at     int64
}

// owedCounts is a Redis store's debts, under mu.
type owedCounts struct {
	mu     sync.Mutex
	debts  map[owedKey]owedDebt
	max    int
	listed bool // the backend pays them when it recovers (redisBackend.oweOnRecovery)
}

func newOwedCounts(max int) *owedCounts {
	return &owedCounts{debts: map[owedKey]owedDebt{}, max: max}
}

// oweCharged records what a take in the fallback charged, while Redis is
// down: a call that failed for another reason (a busy pool, a replaced
// configuration) leaves no outage to recover from.
func oweCharged(s *redisStore, t *tally, c *charge) {
	if !s.backend.down.Load() {
		return
	}

	cost := costOf(t)
	o := s.owed

	o.mu.Lock()
	for i, l := range c.Layers {
		if l.CheckOnly || t.Uncharged&(uint64(1)<<uint(i)) != 0 {
			continue
		}

		addDebt(o, owedKey{l: l, key: c.Keys[i]}, owedDebt{points: cost, at: c.Now})
	}
	o.mu.Unlock()

	listOwed(s)
}

// addDebt adds d to k's debt, at the later of their times; past max keys a
// new one is not taken. Called with o.mu held.
func addDebt(o *owedCounts, k owedKey, d owedDebt) {
	cur, ok := o.debts[k]
	if !ok && len(o.debts) >= o.max {
		return
	}

	if cur.at > d.at {
		d.at = cur.at
	}

	d.points += cur.points
	o.debts[k] = d
}

// listOwed has the backend pay the store's debts at its next recovery,
// once however many debts there are.
func listOwed(s *redisStore) {
	o := s.owed

	o.mu.Lock()
	register := !o.listed && len(o.debts) > 0
	if register {
		o.listed = true
	}
	o.mu.Unlock()

	if register {
		s.backend.oweOnRecovery(func() { payOwed(s) })
	}
}

// forgiveRefunded takes back from the debts what a refund during the
// outage gave memory back.
func forgiveRefunded(s *redisStore, c *charge, cost int64) {
	o := s.owed

	o.mu.Lock()
	for i, l := range c.Layers {
		k := owedKey{l: l, key: c.Keys[i]}
		if d, ok := o.debts[k]; ok {
			d.points -= cost
			if d.points > 0 {
				o.debts[k] = d
			} else {
				delete(o.debts, k)
			}
		}
	}
	o.mu.Unlock()
}

// payOwed adds the debts to Redis, a refund of a negative cost per key: the
// refund script adds to a key that exists, and creates a missing one that
// memory still holds a window of (payDebt).
func payOwed(s *redisStore) {
	o := s.owed

	o.mu.Lock()
	debts := o.debts
	o.debts = map[owedKey]owedDebt{}
	o.listed = false
	o.mu.Unlock()

	var unpaid map[owedKey]owedDebt

	for k, d := range debts {
		if unpaid == nil {
			err := payDebt(s, k, d)
			if err == nil {
				continue
			}

			// A replaced configuration's store has nobody left to pay.
			if errors.Is(err, redisresp.ErrClosed) {
				return
			}

			s.backend.failed(s.clock().UnixNano(), false, fmt.Errorf("adding what the memory fallback charged: %w", err))
			unpaid = map[owedKey]owedDebt{}
		}

		unpaid[k] = d
	}

	if unpaid != nil {
		oweAgain(s, unpaid)
	}
}

// payDebt adds one key's debt to Redis. A fixed or sliding key is given the
// milliseconds left in memory's window of it, which the refund script
// creates the key with when Redis lost it; a token bucket is added to only.
func payDebt(s *redisStore, k owedKey, d owedDebt) error {
	ttl := int64(0)
	if k.l.Interval == 0 {
		ttl = windowLeft(s.local, k.l, k.key, s.clock().UnixNano())
	}

	tail := redisresp.Bulk(formatInt(ttl))
	call := refundRedis.Call(1, 7)

	c := &charge{Layers: []*layer{k.l}, Keys: []string{k.key}, Now: d.at}
	if cl := s.backend.cluster; cl != nil {
		g := slotGroups(c, costArg(-d.points))[0]
		replies, err := cl.RunInts([]redisresp.ClusterCall{{Slot: g.slot, Call: call, Encoded: g.keys + g.args + tail}})
		if err == nil && len(replies) == 1 && replies[0].ServerErr != "" {
			err = errors.New("running the refund script: " + replies[0].ServerErr)
		}

		return err
	}

	encoded := encodeCall(c, "", -d.points)

	_, serverErr, err := call.RunIntsOn(s.backend.pool, encoded+tail)
	if err == nil && serverErr != "" {
		err = errors.New("running the refund script: " + serverErr)
	}

	return err
}

// windowLeft is the milliseconds left at now in memory's window of key in
// l, or 0 when memory holds none that is live.
func windowLeft(s *windowStore, l *layer, key string, now int64) int64 {
	s.Mu.Lock()
	defer s.Mu.Unlock()

	w := s.Maps[l.Name][key]
	if w == nil || w.Reset <= now {
		return 0
	}

	return (w.Reset - now + nsPerMillisecond - 1) / nsPerMillisecond
}

// oweAgain puts back the debts a payment could not pay, with what the
// fallback charged since, for the next recovery.
func oweAgain(s *redisStore, unpaid map[owedKey]owedDebt) {
	o := s.owed

	o.mu.Lock()
	for k, d := range unpaid {
		addDebt(o, k, d)
	}
	o.mu.Unlock()

	listOwed(s)
}

// oweOnRecovery runs pay once Redis answers again (succeeded).
func (b *redisBackend) oweOnRecovery(pay func()) {
	b.mu.Lock()
	b.debts = append(b.debts, pay)
	b.mu.Unlock()
}

// payDebts runs the payments of a recovery, off the request that probed.
func payDebts(debts []func()) {
	defer func() { _ = recover() }()

	for _, pay := range debts {
		pay()
	}
}
