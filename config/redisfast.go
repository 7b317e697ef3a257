package config

// What the root's Redis fast paths (its paths.go: redisPath, mixedPath,
// clusterPath, syncedPath) need of the configuration, for its chooseMode.

// RedisFastEligible tells the root's chooseMode whether an instance that
// would otherwise take the general path meets what the Redis fast path
// (redisPath) needs: its paths.go states what.
func RedisFastEligible(s *Settings, fixed, routes bool) bool {
	return s.Store == StoreRedis && sharedClient(s) && slotsServed(s) &&
		s.Headers && !s.DryRun && fixed && !routes && s.WSMaxPerIP == 0 &&
		s.UserHeader == "" && len(s.CredHeaders)+len(s.CredCookies)+len(s.CredQuery) == 0 &&
		len(s.ExemptIPs)+len(s.ExemptIDs) == 0 &&
		s.Spec(LayerIP).On() && (s.Spec(LayerAssets).On() || len(s.AssetPaths) == 0)
}

// sharedClient reports whether the layers keyed by the client that a Redis
// path charges (ip, and assets when on) count in Redis, and whether an
// instance with layers counted in memory (AnyMemoryLayer) counts the others
// exactly: mixedPath charges both stores, the synced counters' path
// (syncedPath) Redis's alone.
func sharedClient(s *Settings) bool {
	if !AnyMemoryLayer(s) {
		return true
	}

	return s.SyncInterval == 0 && !s.Spec(LayerIP).Memory && !s.Spec(LayerAssets).Memory
}

// oneSlot reports whether a Redis path's call has its keys in one slot: on
// one server or a Sentinel's primary, always; on a Cluster, when global
// counts in memory (mixedPath), so that the call's layers in Redis are
// those keyed by the client, whose key's hash tag it is.
func oneSlot(s *Settings) bool {
	return s.Redis.Cluster == nil || s.Spec(LayerGlobal).On() && s.Spec(LayerGlobal).Memory
}

// slotsServed reports whether a Redis path serves the instance's keys
// wherever their slots are: in one slot (oneSlot); with redis.syncInterval,
// whose path makes no Redis call (syncedPath: the leases go off the request
// path, one call per slot, redisstore.SendLeases); or global in Redis beside the
// client's layer on a Cluster (clusterPath: a call per slot, sent
// together).
func slotsServed(s *Settings) bool {
	return oneSlot(s) || s.SyncInterval > 0 || s.Spec(LayerGlobal).On()
}
