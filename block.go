package tierlimit

import "github.com/tierlimit/tierlimit/rule"
import "github.com/tierlimit/tierlimit/limit"

// A layer's blockDuration (README: blockDuration) refuses every request of a
// key it refused, for that long from the refusal, even after the key's window
// resets. The memory store keeps the blocks in a map per layer beside its
// counters, rather than on them: a block outlives its window, which the
// counter lists expire and purge in order of start. Redis keeps a block as a
// key of its own (takeScript), and every replica learns its end from the
// script's reply (its block list, blockList).

// blockingStore is the memory store of an instance with a blockDuration
// layer: it checks the blocks before windowStore.take and starts one after a
// refusal, so that take, shared by every instance, costs layers without a
// block nothing more (doc.go: frames). It is the Redis store's memory
// fallback too (redisStore.takeLocal): during an outage the block list
// refuses the keys Redis blocked, and a refusal in memory starts a block.
type blockingStore struct {
	*windowStore
}

// anyBlock reports whether one of the layers has a blockDuration.
func anyBlock(layers []*layer) bool {
	for _, l := range layers {
		if l.BlockDuration != 0 {
			return true
		}
	}

	return false
}

// take is windowStore.take with the layers' blocks: a request of a blocked
// key is refused, charged nowhere; a refusal of a layer with a
// blockDuration blocks its key. A dry run, which refuses nothing, neither
// honours nor starts blocks.
func (b *blockingStore) take(t *tally, c *charge) {
	s := b.windowStore

	if !c.All && refuseAny(b, t, c) {
		return
	}

	s.take(t, c)

	if !t.Refused || c.All || t.Shown < 0 || c.Layers[t.Shown].BlockDuration == 0 {
		return
	}

	s.mu.Lock()
	s.startBlock(t, t.Shown, c.Now, c.Layers[t.Shown], c.Keys[t.Shown])
	s.mu.Unlock()
}

// refuseAny refuses the request when one of its keys is blocked, and
// reports whether it did. The blocked layer refuses in its turn, as in
// Redis: a layer before it that refuses is the one shown, and the layers
// before it that allow are charged and given back (between the two holds of
// the lock another request may see that charge; the counts end exact).
func refuseAny(b *blockingStore, t *tally, c *charge) bool {
	s := b.windowStore
	i := firstBlocked(b, c)

	if i < 0 {
		return false
	}

	cost := costOf(t)

	if i > 0 {
		s.take(t, rule.ChargePrefix(c, i))
		if t.Refused {
			return true
		}
	}

	s.mu.Lock()
	giveBack(c, i, cost, t.Uncharged)
	*t = tally{Cost: t.Cost}

	if !refuseBlockedAt(s, t, c, i) {
		t.Shown = -1 // the block ended meanwhile: decided afresh
		s.mu.Unlock()

		return false
	}

	s.mu.Unlock()

	return true
}

// firstBlocked returns the index of the first of c's layers whose key is
// blocked at c.now, or -1. A dry-run layer refuses nothing: a block it
// started before a reload to dry run is not honoured.
func firstBlocked(b *blockingStore, c *charge) int {
	s := b.windowStore

	s.mu.Lock()
	defer s.mu.Unlock()

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

// refuseBlockedAt refuses c's layer i while its key is blocked, under the
// store's lock, and reports whether it did. The block's refusals are its own first
// refusal's event, so none of them is reported; each is counted (the layer's
// and the key's refused).
func refuseBlockedAt(s *windowStore, t *tally, c *charge, i int) bool {
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
	t.Refuse(i, l.Points+1, until, []string{formatInt(limit.CeilSeconds(until))}, false)

	return true
}

// startBlock blocks key in l from now, after layers[i] refused it: the
// refusal shown then says when the block ends, and it is reported (one event
// per block, whatever the window's earlier refusals).
func (s *windowStore) startBlock(t *tally, i int, now int64, l *layer, key string) {
	if l.Blocks[key] > now {
		return
	}

	trimEntries(l.Blocks, s.max, now)

	until := now + l.BlockDuration
	l.Blocks[key] = until
	t.Firsts |= uint64(1) << uint(i)

	// The refusal that starts the block is its first.
	hits := blockHitsOf(s, l)
	hits[key] = 1

	if t.Shown == i {
		// One value per statement: doc.go, constructs Yaegi cannot run.
		t.Reset = until
		t.ResetH = []string{formatInt(limit.CeilSeconds(until))}
	}
}

// forgetBlock drops key's block in l and reports whether it still refused.
func (s *windowStore) forgetBlock(l *layer, key string, now int64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()

	until, ok := s.blocks[l.Name][key]
	if !ok {
		return false
	}

	delete(s.blocks[l.Name], key)
	delete(s.blockHits[l.Name], key)

	return until > now
}

// blockedKeys copies the memory store's blocks running at now whose key
// starts with prefix, for the status page.
func (s *windowStore) blockedKeys(now int64, layers []*layer, prefix string) []blockedKey {
	var out []blockedKey

	s.mu.Lock()

	for _, l := range layers {
		for key, until := range s.blocks[l.Name] {
			if until > now && (prefix == "" || len(key) >= len(prefix) && key[:len(prefix)] == prefix) {
				out = append(out, blockedKey{layer: l.Name, prefix: l.BlockPrefix, key: key, reset: until, refused: s.blockHits[l.Name][key]})
			}
		}
	}

	s.mu.Unlock()

	return out
}

// forgetBlockKey drops key's block in the layer named layer: a reset that
// another replica published (resetsub.go), which clears the memory fallback's
// blocks too.
func (s *windowStore) forgetBlockKey(layer, key string) {
	s.mu.Lock()
	delete(s.blocks[layer], key)
	delete(s.blockHits[layer], key)
	s.mu.Unlock()
}

// countBlocked counts a request that the block of key in l refused: in the
// block's refusals, and in its window's while the layer has it (a blocked
// key's window is not charged, so it ends and is replaced only after the
// block). Called with s.mu held.
func countBlocked(s *windowStore, l *layer, key string) {
	if w := l.Entries[key]; w != nil && w.List == l.List {
		w.Refused++
	}

	hits := blockHitsOf(s, l)
	hits[key]++
}

// blockHitsOf returns the refusal counts of l's running blocks, made when
// missing; at the cap it first drops those of blocks that are gone. Called
// with s.mu held.
func blockHitsOf(s *windowStore, l *layer) map[string]int64 {
	if s.blockHits == nil {
		s.blockHits = map[string]map[string]int64{}
	}

	hits := s.blockHits[l.Name]
	if hits == nil {
		hits = map[string]int64{}
		s.blockHits[l.Name] = hits
	}

	if len(hits) >= s.max {
		for key := range hits {
			if _, ok := l.Blocks[key]; !ok {
				delete(hits, key)
			}
		}
	}

	return hits
}
