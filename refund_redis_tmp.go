package tierlimit

import "net/http"

// refund: temporary, until the Redis refund script lands.
func (s *redisStore) refund(now int64, layers []*layer, client, principal string, req *http.Request, cost int64) {
	s.local.refund(now, layers, client, principal, req, cost)
}
