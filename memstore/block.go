package memstore

import (
	"strconv"

	"github.com/tierlimit/tierlimit/limit"
	"github.com/tierlimit/tierlimit/rule"
)

// A layer's blockDuration (README: blockDuration) refuses every request of a
// key it refused, for that long from the refusal, even after the key's window
// resets. The memory store keeps the blocks in a map per layer beside its
// counters, rather than on them: a block outlives its window, which the
// counter lists expire and purge in order of start. Redis keeps a block as a
// key of its own (takeScript), and every replica learns its end from the
// script's reply (its block list, blockList).

// refuseBlockedAt refuses c's layer i while its key is blocked, under the
// store's lock, and reports whether it did. The block's refusals are its own first
// refusal's event, so none of them is reported; each is counted (the layer's
// and the key's refused).
func refuseBlockedAt(s *WindowStore, t *rule.Tally, c *rule.Charge, i int) bool {
	l, key, now := c.Layers[i], c.Keys[i], c.Now
	until := l.Blocks[key]
	if until == 0 {
		return false
	}

	if until <= now {
		delete(l.Blocks, key)
		delete(s.blockHits[l.Name], key)

		return false
	}

	l.Stats.Refused++
	countBlocked(s, l, key)
	rule.Refuse(t, i, l.Capacity+1, until, []string{strconv.FormatInt(limit.CeilSeconds(until), 10)}, false)

	return true
}

// StartBlock blocks key in l from now, after layers[i] refused it: the
// refusal shown then says when the block ends, and it is reported (one event
// per block, whatever the window's earlier refusals).
func (s *WindowStore) StartBlock(t *rule.Tally, i int, now int64, l *rule.Layer, key string) {
	if l.Blocks[key] > now {
		return
	}

	TrimEntries(l.Blocks, s.Max, now)

	until := now + l.BlockDuration
	l.Blocks[key] = until
	t.Firsts |= uint64(1) << uint(i)

	// The refusal that starts the block is its first.
	hits := blockHitsOf(s, l)
	hits[key] = 1

	if t.Shown == i {
		// One value per statement: doc.go, constructs Yaegi cannot run.
		t.Reset = until
		t.ResetH = []string{strconv.FormatInt(limit.CeilSeconds(until), 10)}
	}
}

// ForgetBlock drops key's block in l and reports whether it still refused.
func (s *WindowStore) ForgetBlock(l *rule.Layer, key string, now int64) bool {
	s.Mu.Lock()
	defer s.Mu.Unlock()

	until, ok := s.Blocks[l.Name][key]
	if !ok {
		return false
	}

	delete(s.Blocks[l.Name], key)
	delete(s.blockHits[l.Name], key)

	return until > now
}

// BlockedKey is a block list entry as the status endpoint lists it; prefix
// tells an entry of the layer's current limits (layer.blockPrefix).
type BlockedKey struct {
	Layer   string
	Prefix  string
	Key     string
	Reset   int64
	Refused int64 // the requests a blockDuration block refused (0: not counted)
}

// BlockedKeys copies the memory store's blocks running at now whose key
// starts with prefix, for the status page.
func (s *WindowStore) BlockedKeys(now int64, layers []*rule.Layer, prefix string) []BlockedKey {
	var out []BlockedKey

	s.Mu.Lock()

	for _, l := range layers {
		for key, until := range s.Blocks[l.Name] {
			if until > now && (prefix == "" || len(key) >= len(prefix) && key[:len(prefix)] == prefix) {
				out = append(out, BlockedKey{Layer: l.Name, Prefix: l.BlockPrefix, Key: key, Reset: until, Refused: s.blockHits[l.Name][key]})
			}
		}
	}

	s.Mu.Unlock()

	return out
}

// ForgetBlockKey drops key's block in the layer named layer: a reset that
// another replica published (../redisstore/resetsub.go), which clears the memory fallback's
// blocks too.
func (s *WindowStore) ForgetBlockKey(layer, key string) {
	s.Mu.Lock()
	delete(s.Blocks[layer], key)
	delete(s.blockHits[layer], key)
	s.Mu.Unlock()
}

// countBlocked counts a request that the block of key in l refused: in the
// block's refusals, and in its window's while the layer has it (a blocked
// key's window is not charged, so it ends and is replaced only after the
// block). Called with s.mu held.
func countBlocked(s *WindowStore, l *rule.Layer, key string) {
	if w := l.Entries[key]; w != nil && w.List == l.List {
		w.Refused++
	}

	hits := blockHitsOf(s, l)
	hits[key]++
}

// blockHitsOf returns the refusal counts of l's running blocks, made when
// missing; at the cap it first drops those of blocks that are gone. Called
// with s.mu held.
func blockHitsOf(s *WindowStore, l *rule.Layer) map[string]int64 {
	if s.blockHits == nil {
		s.blockHits = map[string]map[string]int64{}
	}

	hits := s.blockHits[l.Name]
	if hits == nil {
		hits = map[string]int64{}
		s.blockHits[l.Name] = hits
	}

	if len(hits) >= s.Max {
		for key := range hits {
			if _, ok := l.Blocks[key]; !ok {
				delete(hits, key)
			}
		}
	}

	return hits
}

// TrimEntries drops the expired entries of m when it holds capacity, then others
// until one more fits.
func TrimEntries(m map[string]int64, capacity int, now int64) {
	if len(m) < capacity {
		return
	}

	for k, r := range m {
		if r <= now {
			delete(m, k)
		}
	}

	for k := range m {
		if len(m) < capacity {
			break
		}

		delete(m, k)
	}
}

// TakeWithBlocks is Take (TakeEach for a tally with items, tally.Each), or
// takeBlocking when blocks is set: what a store
// whose layers may block (a blockDuration counted in memory) calls.
func TakeWithBlocks(s *WindowStore, blocks bool, t *rule.Tally, c *rule.Charge) {
	if blocks {
		takeBlocking(s, t, c)
		return
	}

	if t.Each != nil {
		TakeEach(s, t, c)
		return
	}

	Take(s, t, c)
}

// takeBlocking is Take with the layers' blocks, for an instance with a
// blockDuration layer in memory and for the Redis store's fallback: a
// request of a blocked key is refused, charged nowhere; a refusal of a
// layer with a blockDuration blocks its key. A dry run, which refuses
// nothing, neither honours nor starts blocks. Take, shared by every
// instance, costs layers without a block nothing more (../doc.go: frames).
func takeBlocking(s *WindowStore, t *rule.Tally, c *rule.Charge) {
	if !c.All && refuseAny(s, t, c) {
		return
	}

	if t.Each != nil {
		TakeEach(s, t, c)
	} else {
		Take(s, t, c)
	}

	if !t.Refused || c.All || t.Shown < 0 || c.Layers[t.Shown].BlockDuration == 0 {
		return
	}

	s.Mu.Lock()
	s.StartBlock(t, t.Shown, c.Now, c.Layers[t.Shown], c.Keys[t.Shown])
	s.Mu.Unlock()
}

// refuseAny refuses the request when one of its keys is blocked, and
// reports whether it did. The blocked layer refuses in its turn, as in
// Redis: a layer before it that refuses is the one shown, and the layers
// before it that allow are charged and given back (between the two holds of
// the lock another request may see that charge; the counts end exact).
func refuseAny(s *WindowStore, t *rule.Tally, c *rule.Charge) bool {
	i := firstBlocked(s, c)

	if i < 0 {
		return false
	}

	cost := rule.CostOf(t)

	if i > 0 {
		Take(s, t, rule.ChargeSpan(c, 0, i))
		if t.Refused {
			return true
		}
	}

	s.Mu.Lock()
	GiveBack(c, i, cost, t.Uncharged)
	*t = rule.Tally{Cost: t.Cost}

	if !refuseBlockedAt(s, t, c, i) {
		t.Shown = -1 // the block ended meanwhile: decided afresh
		s.Mu.Unlock()

		return false
	}

	s.Mu.Unlock()

	return true
}

// firstBlocked returns the index of the first of c's layers whose key is
// blocked at c.now, or -1. A dry-run layer refuses nothing: a block it
// started before a reload to dry run is not honoured.
func firstBlocked(s *WindowStore, c *rule.Charge) int {

	s.Mu.Lock()
	defer s.Mu.Unlock()

	for i, l := range c.Layers {
		if l.BlockDuration == 0 || l.DryRun {
			continue
		}

		if until := l.Blocks[c.Keys[i]]; until > c.Now {
			return i
		}
	}

	return -1
}
