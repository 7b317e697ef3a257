// Package request turns an *http.Request into the facts the plugin limits
// by: the client's key (Resolve, ClientAddr, ClientIn: trusted proxies, the
// X-Forwarded-For walk, IPv6 prefixes and a cache of the walk's results),
// the canonical path (CanonicalPath, CanonicalPattern, AssetHint), a
// WebSocket upgrade (IsUpgrade), and the principal and credentials
// (Principal, PrincipalOf, IsServiceAccount, HasCredentialElsewhere,
// HashKey).
//
// It follows the root's rules for Yaegi (doc.go there): the request path
// calls plain functions over plain structs, never methods, since a method
// call of our own types costs about four times the allocations of a
// function call; and it imports nothing of the plugin, which imports it.
package request
