package review

import (
	"fmt"
	"time"

	"github.com/upgradeguard/upgradeguard/pkg/snapshot"
)

// SnapshotState says which clusters a review read from a snapshot, and how old each was:
// its verdicts are those of the cluster as it was then.
type SnapshotState struct {
	Cluster string    `json:"cluster"`
	TakenAt time.Time `json:"takenAt"`
	// Age is how old the snapshot was when the review ran, rounded to the second.
	Age string `json:"age"`
}

// Note is the state in one line, for a report's reader.
func (s SnapshotState) Note() string {
	return fmt.Sprintf("%s: judged from a snapshot taken %s (%s ago)", s.Cluster, s.TakenAt.UTC().Format(time.RFC3339), s.Age)
}

// snapshotStates are the states of the clusters given as snapshots, at now.
func snapshotStates(clusters []Cluster, now time.Time) []SnapshotState {
	var out []SnapshotState
	for _, c := range clusters {
		if c.Snapshot == nil {
			continue
		}
		out = append(out, SnapshotState{Cluster: c.Name, TakenAt: c.Snapshot.TakenAt, Age: c.Snapshot.Age(now).Round(time.Second).String()})
	}
	return out
}

// recorded is the cluster's snapshot as check reads it, nil for a live cluster.
func (c Cluster) recorded() *snapshot.Cluster {
	if c.Snapshot == nil {
		return nil
	}
	return c.Snapshot.Cluster()
}
