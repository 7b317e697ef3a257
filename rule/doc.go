// Package rule holds a layer as every part of the plugin uses it: what its
// rule says (Limits), where its counters are (the memory store's map and
// list, its Redis encoding), its header tables and its refusal; and what one
// request's decision takes and gives (Charge: the layers and their keys,
// made by KeyFor; Tally: the outcome). It is data: the root builds it in New
// (build.go), the stores count by it, the answer reads it. The arithmetic is
// package limit.
package rule
