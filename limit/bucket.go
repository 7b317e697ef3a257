package limit

// A token bucket is the one of golang.org/x/time/rate: burst tokens, full at
// a key's first request, refilled one token per interval, computed as the
// generic cell rate algorithm. A key's whole state is its theoretical
// arrival time tat, the moment its bucket is full again (a tat before now is
// a full bucket, as one at now). A take of cost tokens at now fits iff
//
//	max(tat, now) - now <= (burst - cost) x interval
//
// and then tat becomes max(tat, now) + cost x interval. The tokens in use
// are ceil((tat - now) / interval), so a take fits iff the tokens in use
// plus cost are at most burst. A take that does not fit takes nothing and
// fits at tat - (burst - cost) x interval. The Redis script computes the
// same in exact integer microseconds with Redis's clock.

// BucketTake takes cost tokens at now from a bucket of burst tokens refilled
// one per interval whose TAT is tat. If they fit, it returns the TAT after
// the take and the tokens then in use (at most burst); if not, the time they
// fit at and burst + 1, and takes nothing. A cost of 0 reads the bucket: its
// TAT (now if it is full) and its tokens in use (burst + 1 if more than
// burst are, as a reload that lowered the burst can leave).
func BucketTake(tat, now, cost, burst, interval int64) (int64, int64) {
	if tat < now {
		tat = now
	}

	room := (burst - cost) * interval
	if tat-now > room {
		return tat - room, burst + 1
	}

	tat += cost * interval

	return tat, (tat - now + interval - 1) / interval
}

// BucketHorizon is the latest TAT a bucket holds: a spend beyond it (a
// response stating a huge cost on a slow bucket) saturates there, far from
// int64 overflow, and so does a give-back.
const BucketHorizon = int64(1) << 62

// BucketSpend takes cost tokens at now whatever the burst: a response's
// cost beyond what its request reserved, which a bucket repays as it
// refills. It returns the TAT after the spend (BucketTake's without the
// refusal, saturating at BucketHorizon) and the tokens then in use, which
// may exceed the burst.
func BucketSpend(tat, now, cost, interval int64) (int64, int64) {
	if tat < now {
		tat = now
	}

	if cost > (BucketHorizon-tat)/interval {
		tat = BucketHorizon
	} else {
		tat += cost * interval
	}

	return tat, (tat - now + interval - 1) / interval
}

// BucketReturn returns the TAT of a bucket given back cost tokens that a take
// took: cost intervals earlier, at most BucketHorizon earlier (a give-back
// past it leaves a full bucket, as what the spend saturated is unknown). A
// TAT that falls before now is a full bucket.
func BucketReturn(tat, cost, interval int64) int64 {
	if cost > BucketHorizon/interval {
		return tat - BucketHorizon
	}

	return tat - cost*interval
}
