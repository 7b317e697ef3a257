package memstore

// Live is the memory store's lifetime.Live: the latest end of its counters (a fixed
// or calendar window's reset, a sliding window's reset plus one duration, a
// token bucket's refill) and of its blocks.
func Live(v interface{}, now int64) int64 {
	s, ok := v.(*WindowStore)
	if !ok {
		return 0
	}

	s.Mu.Lock()
	defer s.Mu.Unlock()

	var until int64

	for _, m := range s.Maps {
		for _, w := range m {
			if w.Expire > until {
				until = w.Expire
			}
		}
	}

	for _, m := range s.Blocks {
		until = LatestAfter(m, until)
	}

	return until
}

// LatestAfter returns the latest of until and the values of m.
func LatestAfter(m map[string]int64, until int64) int64 {
	for _, end := range m {
		if end > until {
			until = end
		}
	}

	return until
}
