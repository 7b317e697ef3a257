package rule

import (
	"strconv"
	"time"

	"github.com/tierlimit/tierlimit/answer"
	"github.com/tierlimit/tierlimit/config"
	"github.com/tierlimit/tierlimit/limit"
)

// NewRefusal is the configured refusal of layer l (Layer.Refusal): the
// default JSON body around its reset time, or response.body's template
// bound to the layer.
func NewRefusal(s *config.Settings, l *Layer) Refusal {
	r := Refusal{Policy: answer.Policy{
		Status:      s.RefusalStatus,
		ContentType: answer.JSONContentType,
		BodyPrefix:  `{"errors":[{"message":"Hit rate limit","extensions":{"code":"REQUESTS_EXCEEDED","limit":` + l.Limit + `,"reset":"`,
		BodySuffix:  `","layer":"` + l.Name + `"}}]}`,
	}}

	if s.RefusalType != answer.JSONContentType[0] {
		r.ContentType = []string{s.RefusalType}
	}

	if s.ResponseBody != "" {
		body, _ := answer.ParseBodyTemplate(s.ResponseBody) // checked by config.Parse
		r.Body = answer.BindLayer(body, l.Name, l.Limit)
	}

	return r
}

// RefusalHeaders are the names of refusalCache.Values, in their order.
var RefusalHeaders = []string{
	"X-Ratelimit-Limit", "Ratelimit-Policy", "X-Ratelimit-Reset", "X-Ratelimit-Remaining",
	"Ratelimit", "Retry-After", "Content-Type", "Cache-Control",
}

// CacheRefusal caches the refusal of layer l for a window that resets at
// reset (resetH formatted), secs seconds from now. The slices handed out
// before are left as they are: requests that read them may still be writing
// them. A function, not a method (../doc.go: functions, not methods).
func CacheRefusal(l *Layer, resetH string, reset, secs int64) {
	c := &l.Cache
	if c.ResetH != resetH {
		c.ResetH = resetH
		c.ResetSec = limit.CeilSeconds(reset)
		c.Body = []byte(l.BodyPrefix + time.Unix(limit.CeilSeconds(reset), 0).UTC().Format(time.RFC3339) + l.BodySuffix)
	}

	c.Secs = secs
	c.Values = [][]string{
		l.LimitHdr, l.PolicyHdr, {resetH}, l.RemainingHdr[0],
		{`"` + l.Name + `";r=0;t=` + strconv.FormatInt(secs, 10)}, {strconv.FormatInt(secs, 10)}, l.ContentType, answer.NoStore,
	}
}
