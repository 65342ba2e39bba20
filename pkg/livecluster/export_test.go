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
