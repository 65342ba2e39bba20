package check

import (
	"context"
	"errors"

	"github.com/upgradeguard/upgradeguard/pkg/crdschema"
	"github.com/upgradeguard/upgradeguard/pkg/helmrelease"
)

// Warming says what a Warmer reads ahead of a prediction: what Warm found the prediction
// will read.
type Warming struct {
	// CRDs name the live CRDs whose objects the prediction will read: the objects of each
	// served version, as the schema check reads them.
	CRDs []string
	// PageLimit is the Limit of the first page of those objects the schema check asks for.
	PageLimit int64
}

// Warmer is a Cluster that can read ahead what a prediction will read, so that the
// prediction reads it from memory (livecluster.KubeCluster; one that keeps nothing
// between predictions does nothing).
type Warmer interface {
	Cluster
	Warm(ctx context.Context, w Warming) error
}

// Warm reads now what a prediction for release (read by releases) on cluster will read
// before its incoming chart is known, so that the first decision on the release after a
// start reads from memory: the deployed revision and its CRDs (into cluster's Memory),
// and, through cluster.Warm, what the schema check of those CRDs reads. It does nothing
// for a cluster without a Memory, and nothing for a release not installed yet. It only
// reads.
func Warm(ctx context.Context, cluster Warmer, releases *helmrelease.Reader, release string) error {
	if cluster.Memory() == nil || releases == nil {
		return nil
	}
	s := Sources{Cluster: cluster, Releases: releases, Release: release}
	current, key, err := releases.Deployed(ctx, release)
	if nf := (*helmrelease.NotFoundError)(nil); errors.As(err, &nf) {
		return nil
	}
	if err != nil {
		return err
	}
	var req Request
	if err := s.currentMemo(current, key, &req, &Prediction{}); err != nil {
		return err
	}
	names := make([]string, 0, len(req.Current))
	for _, c := range req.Current {
		names = append(names, c.CRD.Name)
	}
	return cluster.Warm(ctx, Warming{CRDs: names, PageLimit: crdschema.DefaultPageSize})
}
