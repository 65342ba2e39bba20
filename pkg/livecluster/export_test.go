package livecluster

import "slices"

// Informers names the informers a KubeCluster of Clusters runs besides its CRD informer.
func Informers(k *KubeCluster) []string {
	k.watch.mu.Lock()
	defer k.watch.mu.Unlock()
	var out []string
	for key := range k.watch.informers {
		out = append(out, key)
	}
	slices.Sort(out)
	return out
}

// Synced says, for each informer a KubeCluster of Clusters runs besides its CRD
// informer, whether it has synced.
func Synced(k *KubeCluster) map[string]bool {
	k.watch.mu.Lock()
	defer k.watch.mu.Unlock()
	out := map[string]bool{}
	for key, wd := range k.watch.informers {
		out[key] = wd.inf.HasSynced()
	}
	return out
}

// PoliciesCompiled says whether a kept target holds its admission policies compiled.
func PoliciesCompiled(k *KubeCluster) bool {
	k.policies.Lock()
	defer k.policies.Unlock()
	return k.policies.loaded
}
