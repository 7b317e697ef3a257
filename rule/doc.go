// Package rule holds a layer as every part of the plugin uses it: what its
// rule says (Limits), where its counters are (a pointer to the memory
// store's table of them, package counter; its Redis encoding), its header
// tables and its refusal, which are the layer's answer; and what one
// request's decision takes and gives (Charge: the layers and their keys;
// Tally: the outcome). It is data: the root builds it in New (build.go), the
// stores count by it, the answer reads it. The arithmetic is package limit.
package rule
