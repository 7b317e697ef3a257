package rule

import (
	"reflect"
	"strconv"

	"github.com/tierlimit/tierlimit/config"
	"github.com/tierlimit/tierlimit/limit"
)

// NewLayer is the layer of spec, a rule that is on, as far as it depends on
// the rule alone: its limits, a token bucket's burst and rate, its header
// table and a month's policy. keyKind is how it finds its key (KeyOf*),
// unless spec keys by a header or the host. Each store adds its own part
// (memstore's Attach, redisstore's Encode); the root's newLayer builds the
// whole.
func NewLayer(spec config.Rule, keyKind int) *Layer {
	if spec.KeyHeader != "" {
		keyKind = KeyOfHeader
	}

	if spec.KeyHost {
		keyKind = KeyOfHost
	}

	if spec.KeyParts != nil {
		keyKind = KeyOfParts
	}

	l := &Layer{Limits: Limits{Capacity: spec.Points, KeyKind: keyKind, ConstKey: config.LayerGlobal, KeyParts: keyParts(spec.KeyParts), Alg: int(spec.Algorithm)}}
	// What the layer keeps of its rule as the rule says it, by name (a
	// duration in nanoseconds); what it computes is set above.
	config.CopyByName(reflect.ValueOf(&l.Limits).Elem(), reflect.ValueOf(spec))

	// A token bucket's points become its burst (memstore/bucket.go).
	if spec.Algorithm == limit.TokenBucket {
		spec = makeBucket(l, spec)
	}

	l.HeaderTable = newHeaderTable(spec, l.Interval)

	if spec.Calendar == limit.Month {
		l.Month = &MonthPolicy{}
	}

	return l
}

// keyParts is a key's parts as the request path reads them; nil for none.
func keyParts(parts []config.KeyPart) []KeyPart {
	if parts == nil {
		return nil
	}

	kinds := map[string]int{config.KeyIP: KeyOfClient, config.KeyPrincipal: KeyOfPrincipalElseClient, config.KeyHost: KeyOfHost, config.KeyHeader: KeyOfHeader, config.KeyJSON: KeyOfJSON}
	out := make([]KeyPart, len(parts))

	for i, p := range parts {
		out[i] = KeyPart{Kind: kinds[p.Key], Header: p.Header, Path: p.Path}
	}

	return out
}

// makeBucket turns l into a token bucket for spec: points becomes the burst,
// the bucket's capacity, which the headers and the refusal report as the limit.
// It returns spec with its points set to the burst likewise.
func makeBucket(l *Layer, spec config.Rule) config.Rule {
	l.Refill = spec.Points
	l.Interval = int64(spec.Duration) / spec.Points
	l.Capacity = spec.Burst
	l.Limit = strconv.FormatInt(spec.Burst, 10)
	spec.Points = spec.Burst

	return spec
}

// newHeaderTable makes a layer's header values; a token bucket's policy
// window is the time its burst takes to refill (interval per point).
func newHeaderTable(spec config.Rule, interval int64) HeaderTable {
	points := strconv.FormatInt(spec.Points, 10)
	window := int64(spec.Duration)
	if spec.Algorithm == limit.TokenBucket {
		window = spec.Points * interval
	}

	t := HeaderTable{
		Limit:     points,
		LimitHdr:  []string{points},
		PolicyHdr: []string{`"` + spec.Name + `";q=` + points + ";w=" + strconv.FormatInt(limit.CeilSeconds(window), 10) + policyUnit(spec)},
	}

	for left := int64(0); left <= spec.Points && left < MaxPrecomputed; left++ {
		t.RemainingHdr = append(t.RemainingHdr, []string{strconv.FormatInt(left, 10)})
		t.RatePrefix = append(t.RatePrefix, `"`+spec.Name+`";r=`+strconv.FormatInt(left, 10)+";t=")
	}

	t.TableLen = int64(len(t.RemainingHdr))
	t.PolicyItem = ", " + t.PolicyHdr[0]
	t.RateItem = `, "` + spec.Name + `";r=`

	return t
}

// policyUnit is what RateLimit-Policy adds for a layer's quota unit: a
// concurrency layer counts requests in flight.
func policyUnit(spec config.Rule) string {
	if spec.Algorithm == limit.Concurrency {
		return `;qu="concurrent-requests"`
	}

	return ""
}
