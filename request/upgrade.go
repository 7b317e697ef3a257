package request

import (
	"net/http"
	"strings"
)

// IsUpgrade reports whether req asks for a WebSocket upgrade.
func IsUpgrade(req *http.Request) bool {
	if !strings.EqualFold(req.Header.Get("Upgrade"), "websocket") {
		return false
	}

	for _, v := range req.Header["Connection"] {
		for _, token := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(token), "upgrade") {
				return true
			}
		}
	}

	return false
}
