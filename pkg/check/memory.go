package check

import (
	"k8s.io/utils/lru"

	"github.com/upgradeguard/upgradeguard/pkg/crdschema"
)

// Memory is what check keeps of one cluster between predictions: the CRDs of each stored
// release revision, by the key helmrelease.Reader.Deployed gives it, and the compiled
// schema judges (crdschema.Judges). Whoever keeps a cluster between decisions keeps one
// Memory with it, and hands it to check through Cluster.Memory (a target of
// livecluster.Clusters does), so every prediction on that cluster goes through it. It is
// safe for concurrent use.
type Memory struct {
	revisions *lru.Cache // release record key -> []chartcrds.CRD
	judges    *crdschema.Judges
}

// Bounds of a Memory: a judge of a large CRD holds a few MiB of compiled validators.
const (
	maxRevisions = 64
	maxJudges    = 32
)

// NewMemory builds an empty Memory.
func NewMemory() *Memory {
	return &Memory{revisions: lru.New(maxRevisions), judges: crdschema.NewJudges(maxJudges)}
}
