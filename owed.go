package tierlimit

import (
	"net/http"
	"sync"
)

// What the memory fallback admits during an outage is added to Redis when
// Redis answers again, so that a flap does not split a key's count between
// the two stores and let their sum through: memory starts from what Redis
// last reported (fallback.go), and Redis then takes what memory charged.
// Only keys Redis still holds are paid (a window that ended in Redis during
// the outage is not started again), fixed and sliding windows only (a token
// bucket's charge is not carried over), at most maxTracked keys per
// middleware, and once: a payment that fails is not retried.

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
		if l.checkOnly || l.interval != 0 || t.uncharged&(uint64(1)<<uint(i)) != 0 {
			continue
		}

		k := owedKeyOf(l, client, principal, req)
		d, ok := o.debts[k]
		if !ok && len(o.debts) >= o.max {
			continue
		}

		o.debts[k] = owedDebt{points: d.points + cost, at: now}
	}

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

	for k, d := range debts {
		s.refund(d.at, []*layer{k.l}, k.client, k.principal, nil, -d.points)
	}
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
