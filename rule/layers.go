package rule

// What an instance's layers hold, asked once when it is built (the root's
// build.go) or off the common request path.

// AnyBlock reports whether one of the layers has a blockDuration.
func AnyBlock(layers []*Layer) bool {
	for _, l := range layers {
		if l.BlockDuration != 0 {
			return true
		}
	}

	return false
}

// QuietDryRuns marks the dry-run layers quiet unless every layer is in dry
// run (Limits.Quiet).
func QuietDryRuns(layers []*Layer) {
	enforced := false
	for _, l := range layers {
		enforced = enforced || !l.DryRun
	}

	for _, l := range layers {
		l.Quiet = l.DryRun && enforced
	}
}

// CheckOnlyBits has bit i set for each check-only layer of layers, which a
// take evaluated but did not charge.
func CheckOnlyBits(layers []*Layer) uint64 {
	var bits uint64

	for i, l := range layers {
		if l.CheckOnly {
			bits |= uint64(1) << uint(i)
		}
	}

	return bits
}

// ChargedOnly is layers without those a deferred refund gives nothing
// back to: the check-only ones, which a take evaluated but did not charge,
// and concurrency layers, whose slot the request holds until its release
// frees it (../inflight.go): a refund timed later would free another
// request's slot, one admitted at the refund's time. layers itself when
// none is.
func ChargedOnly(layers []*Layer) []*Layer {
	var out []*Layer

	for i, l := range layers {
		if !l.CheckOnly && l.Alg != algConcurrency {
			if out != nil {
				out = append(out, l)
			}

			continue
		}

		if out == nil {
			out = append(make([]*Layer, 0, len(layers)), layers[:i]...)
		}
	}

	if out == nil {
		return layers
	}

	return out
}
