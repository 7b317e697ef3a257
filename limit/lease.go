package limit

// LeaseShareDiv divides what a window has left among the replicas that ask:
// a lease is at most 1/LeaseShareDiv of it (rounded up), so a key far from
// its points leases much at once and the last points go one at a time.
const LeaseShareDiv = 4

// LeaseGrant is how many points a window counted at total of points leases
// to a replica that needs need points now (0: none, a top-up) and wants up
// to want: the larger of need and a share of what is left, at most want and
// what is left; nothing when what is left cannot cover need, so that the
// points stay for requests that fit them. The lease script (redisstore) is
// its other form.
func LeaseGrant(points, total, need, want int64) int64 {
	left := points - total
	if left <= 0 || left < need || want <= 0 {
		return 0
	}

	grant := (left + LeaseShareDiv - 1) / LeaseShareDiv
	if grant < need {
		grant = need
	}

	if grant > want {
		grant = want
	}

	if grant > left {
		grant = left
	}

	return grant
}
