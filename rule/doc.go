// Package rule holds a layer as every part of the plugin uses it: what its
// rule says (Limits), pointers to what the stores keep of it (the memory
// store's table of its counters, package counter; its part of the Redis
// script call, package rediscall), its header tables and its refusal,
// which are the layer's answer; and what one
// request's decision takes and gives (Charge: the layers and their keys,
// made by KeyFor; Tally: the outcome). It is data: the root builds it in New (build.go), the
// stores count by it, the answer reads it. The arithmetic is package limit.
package rule
