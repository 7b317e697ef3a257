package tierlimit

import (
	"net/http"

	"github.com/tierlimit/tierlimit/memstore"
)

// In the recommended chain [edge, ForwardAuth, principal instance] the edge
// cannot tell a real credential from one the auth server will pass on as
// anonymous (an unknown scheme, an expired session treated as a guest), and
// the principal instance, which can, has no ip layer of its own. So the edge
// charges no tier bucket to a credentialed request and hands the decision on
// in the request's context; the instance after ForwardAuth settles it:
//   - a principal: the user or service tier, and the edge's ip bucket never;
//   - no principal: the edge's ip bucket, charged there and then, before the
//     backend, so a refusal is a 429 that the backend never sees.
//
// When nothing after the edge settles it (ForwardAuth answered itself, or the
// chain has no principal instance), the edge charges its ip bucket if the
// response status is one of principal.invalidCredentialStatus
// (invalidcred.go). Either way the request lands in exactly one tier bucket.
type pendingIP struct {
	edge    *Plugin
	req     *http.Request // as the edge saw it
	client  string        // the edge's key for its client; "" until pendingClient resolves it
	charged []*layer      // the edge's layers charged up front (global, routes); nil: its planCred
	cost    int64         // what the request was charged in each of them, and is in ip (0: 1)
	skip    uint64        // bit i: charged[i] took nothing (tally.uncharged), so a refund skips it
	claimed bool          // settle's: whoever claims the charge decides it
}

// settle decides the ip charge left pending on a request, and is the only
// code that does: the first caller claims it, and every later call (the
// edge's writer after the principal instance, say) charges nothing, so no
// request is charged to ip twice. With charging unset (the principal
// instance found a principal) nothing is charged. With charging set, the
// edge's ip bucket is charged into t, and settle returns that charge (nil
// when it charged nothing); when it refuses, the
// layers the edge charged up front get their points back, since a refused
// request spends nothing (one noisy client with garbage credentials would
// otherwise spend global for everyone).
func settle(pd *pendingIP, t *tally, now int64, charging bool) *charge {
	if pd.claimed {
		return nil
	}

	pd.claimed = true
	if !charging {
		return nil
	}

	edge := pd.edge
	client := pendingClient(pd)
	cost := pd.cost
	if cost < 1 {
		cost = 1
	}

	t.Cost = cost
	c := chargeOf(edge.planInvalid, client, "", nil, now, edge.dryRun)
	edge.store.Take(t, c)

	charged := pd.charged
	if charged == nil {
		charged = edge.planCred
	}

	if t.Refused && !edge.dryRun && len(charged) > 0 {
		edge.store.Refund(chargeOf(chargedOnly(memstore.ExceptUncharged(charged, pd.skip)), client, "", pd.req, now, false), cost)
	}

	return c
}

// pendingClient returns the edge's key for the client of a request whose ip
// charge is pending, resolving it the first time: a charge that a principal
// settles never needs it.
func pendingClient(pd *pendingIP) string {
	if pd.client == "" {
		pd.client = clientKey(pd.edge.ips, pd.req)
	}

	return pd.client
}

// pendingKey is the context key of a *pendingIP. A pointer of a compiled type:
// unique, comparable, and the same for every instance of the plugin, which
// share one interpreter.
var pendingKey = new(byte)

// afterAuthPlan is the plan of a request at an instance placed after
// ForwardAuth (userHeader set): its principal's tier; none of this instance's
// tiers when an earlier instance left its ip charge pending (charged here to
// that instance's ip bucket); else ip or assets. It settles the pending charge
// either way. ok is false when the pending charge refused the request, which
// has then been answered.
func afterAuthPlan(p *Plugin, rw http.ResponseWriter, req *http.Request, principal string) (layers []*layer, ok bool) {
	if pd, _ := req.Context().Value(pendingKey).(*pendingIP); pd != nil {
		var t tally

		now := pd.edge.now().UnixNano()
		if c := settle(pd, &t, now, principal == ""); c != nil {
			if ok, _ = verdict(pd.edge, rw, req, &t, c); !ok {
				return nil, false
			}

			return p.planCred, true
		}
	}

	switch {
	case principal != "":
		return principalPlan(p, req), true
	case p.assetHint != nil && isAsset(p, req):
		return p.planAssets, true
	}

	return p.planIP, true
}

// chargedOnly is layers without the check-only ones, which a take evaluated
// but did not charge: a refund gives them nothing back.
func chargedOnly(layers []*layer) []*layer {
	var out []*layer

	for i, l := range layers {
		if !l.CheckOnly {
			if out != nil {
				out = append(out, l)
			}

			continue
		}

		if out == nil {
			out = append(make([]*layer, 0, len(layers)), layers[:i]...)
		}
	}

	if out == nil {
		return layers
	}

	return out
}
