package tierlimit

import (
	"net/http"

	"github.com/tierlimit/tierlimit/request"
)

// isAsset reports whether the request's canonical path starts with an asset
// prefix. A path that p.assetHint (request.AssetHint) does not match is none.
func isAsset(p *Plugin, req *http.Request) bool {
	return p.assetHint != nil && p.assetHint.MatchString(req.URL.Path) && hasAnyPrefix(request.CanonicalPath(req.URL.Path, p.foldPaths), p.assetPaths)
}
