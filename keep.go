package tierlimit

// What an unheld registry entry still holds that matters (lifetime.go): the
// live functions of the registries that hold counts. Each returns until when
// (Unix nanoseconds) its value holds something that can still change a
// decision at now, or 0. They run when an entry nobody holds reaches its
// grace or the end they last reported, never on the request path.

// storeLive is the memory store's: the latest end of its counters (a fixed
// or calendar window's reset, a sliding window's reset plus one duration, a
// token bucket's refill) and of its blocks.
func storeLive(v interface{}, now int64) int64 {
	s, ok := v.(*windowStore)
	if !ok {
		return 0
	}

	s.mu.Lock()
	defer s.mu.Unlock()

	var until int64

	for _, m := range s.maps {
		for _, w := range m {
			if w.Expire > until {
				until = w.Expire
			}
		}
	}

	for _, m := range s.blocks {
		until = latestAfter(m, until)
	}

	return until
}

// blockListLive is the Redis block list's: the latest end of a block, or of a
// window whose refusal was reported (noted), so that the middleware
// configured again neither asks Redis for a key it knows blocked nor
// reports a window's refusal twice.
func blockListLive(v interface{}, now int64) int64 {
	b, ok := v.(*blockList)
	if !ok {
		return 0
	}

	b.mu.Lock()
	defer b.mu.Unlock()

	return latestAfter(b.noted, latestAfter(b.until, 0))
}

// latestAfter returns the latest of until and the values of m.
func latestAfter(m map[string]int64, until int64) int64 {
	for _, end := range m {
		if end > until {
			until = end
		}
	}

	return until
}

// connLive is the WebSocket connection counter's: while connections it
// counted are open, they end when their clients go, at no known time, so it
// is checked again a grace later.
func connLive(v interface{}, now int64) int64 {
	c, ok := v.(*connCounter)
	if !ok {
		return 0
	}

	c.mu.Lock()
	open := len(c.byIP)
	c.mu.Unlock()

	if open == 0 {
		return 0
	}

	return now + int64(releaseGrace)
}
