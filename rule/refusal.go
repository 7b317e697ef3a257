package rule

import (
	"github.com/tierlimit/tierlimit/answer"
	"github.com/tierlimit/tierlimit/config"
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
