package tierlimit

import (
	"errors"
	"fmt"
	"net/http"
	"sync"

	"github.com/tierlimit/tierlimit/redisresp"
)

// What the memory fallback admits during an outage is added to Redis when
// Redis answers again, so that a flap does not split a key's count between
// the two stores and let their sum through: memory starts from what Redis
// last reported (fallback.go), and Redis then takes what memory charged.
// Only keys Redis still holds are paid (a window that ended in Redis during
// the outage is not started again), and at most maxTracked keys per
// middleware. A token bucket is charged its outage tokens from where Redis
// holds it, which is exact unless it filled up before the outage's charges.
// A payment that fails keeps what it did not pay for the next recovery: a
// call that timed out after Redis ran it is then paid twice, which refuses
// early, never late.

// owedKey is one layer's key whose outage charges Redis is owed, as the
// client and principal that keyFor makes it from, without a request: a key
// read from the request (a header's, the host's) is kept as the client,
// which keyFor returns for those kinds when it has no request.
type owedKey struct {
	l                 *layer
	client, principal string
}

// owedKeyOf is the owedKey of l's key for a request.
func owedKeyOf(l *layer, client, principal string, req *http.Request) owedKey {
	if l.keyKind == keyOfHeader || l.keyKind == keyOfHost {
		return owedKey{l: l, client: l.keyFor(client, principal, req)}
	}

	return owedKey{l: l, client: client, principal: principal}
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
func oweCharged(s *redisStore, t *tally, now int64, layers []*layer, client, principal string, req *http.Request) {
	if !s.backend.down.Load() {
		return
	}

	cost := costOf(t)
	o := s.owed

	o.mu.Lock()
	for i, l := range layers {
		if l.checkOnly || t.uncharged&(uint64(1)<<uint(i)) != 0 {
			continue
		}

		addDebt(o, owedKeyOf(l, client, principal, req), owedDebt{points: cost, at: now})
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
func forgiveRefunded(s *redisStore, layers []*layer, client, principal string, req *http.Request, cost int64) {
	o := s.owed

	o.mu.Lock()
	for _, l := range layers {
		k := owedKeyOf(l, client, principal, req)
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
// refund script adds to a key that exists and leaves others alone.
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
			err := refundOnRedis(s, d.at, []*layer{k.l}, k.client, k.principal, nil, -d.points)
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
