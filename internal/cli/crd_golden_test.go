package cli

import (
	"fmt"
	"io"

	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/upgradeguard/upgradeguard/pkg/crdbackup"
	"github.com/upgradeguard/upgradeguard/pkg/crdmove"
	"github.com/upgradeguard/upgradeguard/pkg/predict"
)

func crdGolden() []goldenCase {
	backupRes := &crdbackup.BackupResult{Dir: "./lws-backup", CRDs: []crdbackup.CRD{
		{Name: "leaderworkersets.leaderworkerset.x-k8s.io", Group: "leaderworkerset.x-k8s.io", Kind: "LeaderWorkerSet", Resource: "leaderworkersets",
			Namespaced: true, Version: "v1", File: "crds/leaderworkersets.leaderworkerset.x-k8s.io.yaml",
			Objects: crdbackup.Objects{File: "objects/leaderworkersets.leaderworkerset.x-k8s.io.yaml", Count: 12,
				SHA256: "5d41402abc4b2a76b9719d911017c592e2c1b1f1a6b0b1d2c3e4f5a6b7c8d9e0"}},
	}}
	restored := crdbackup.RestoredCRD{Name: "leaderworkersets.leaderworkerset.x-k8s.io", Kind: "LeaderWorkerSet", Version: "v1", CRD: crdbackup.Created,
		Objects: 12, Created: 12, Kept: []string{}, StatusRestored: 12, OwnersRelinked: 1}
	complete := &crdRestoreOutput{RestoreResult: &crdbackup.RestoreResult{Dir: "./lws-backup", CRDs: []crdbackup.RestoredCRD{restored}}, Complete: true}
	var kept []string
	for i := range 22 {
		kept = append(kept, fmt.Sprintf("LeaderWorkerSet/team-b/lws-%02d", i))
	}
	partial := &crdRestoreOutput{RestoreResult: &crdbackup.RestoreResult{Dir: "./lws-backup", CRDs: []crdbackup.RestoredCRD{
		{Name: restored.Name, Kind: "LeaderWorkerSet", Version: "v1", CRD: crdbackup.Existed, Objects: 30, Unchanged: 7, Overwritten: 1, Kept: kept, StatusRestored: 1},
	}}}
	move := predict.CRDMove{CRD: "leaderworkersets.leaderworkerset.x-k8s.io",
		From: predict.ReleaseRef{Namespace: "lws-system", Name: "lws"}, To: predict.ReleaseRef{Namespace: "lws-system", Name: "lws-crds"}}
	live := &apiextv1.CustomResourceDefinition{ObjectMeta: metav1.ObjectMeta{Name: move.CRD,
		Labels:      map[string]string{predict.ManagedByLabel: predict.ManagedByHelm},
		Annotations: map[string]string{predict.ReleaseNameAnnotation: "lws", predict.ReleaseNamespaceAnnotation: "lws-system"}}}
	movedAnnotations, movedLabels := predict.MoveMetadata(move)
	moved := &apiextv1.CustomResourceDefinition{ObjectMeta: metav1.ObjectMeta{Name: move.CRD, Labels: movedLabels, Annotations: movedAnnotations}}
	planned := &crdmove.Result{Move: move, Kind: "LeaderWorkerSet", FromRenders: true, FromRevision: 3, RenderedBy: "chart lws-crds 0.8.0",
		Steps: predict.MoveSteps(move, live, "./lws-crds"), DryRun: true}
	written := &crdmove.Result{Move: move, Kind: "LeaderWorkerSet", FromRenders: true, FromRevision: 3, RenderedBy: "release lws-system/lws-crds revision 1",
		Steps: predict.MoveSteps(move, moved, ""), Changed: true}
	return []goldenCase{
		{name: "crd-adopt-dry-run", v: planned, text: func(w io.Writer) error { return crdAdoptText(w, planned) }},
		{name: "crd-adopt-written", v: written, text: func(w io.Writer) error { return crdAdoptText(w, written) }},
		{name: "crd-backup", v: backupRes, text: func(w io.Writer) error { return crdBackupText(w, backupRes) }},
		{name: "crd-restore", v: complete, text: complete.text},
		{name: "crd-restore-kept", v: partial, text: partial.text},
	}
}
