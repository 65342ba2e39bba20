package chartmigrate

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	release "helm.sh/helm/v4/pkg/release/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/upgradeguard/upgradeguard/pkg/finding"
)

// The planning logic is ours: these tests read the claims, volumes and Secrets the plan
// pairs from a fake clientset. What the API server decides (binding, adoption) is tested
// on a real one in internal/cli.

const (
	oldManifest = `---
apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: olddb-data
spec:
  accessModes: [ReadWriteOnce]
  resources: {requests: {storage: 1Gi}}
---
apiVersion: v1
kind: Secret
metadata:
  name: olddb-credentials
type: Opaque
`
	newManifest = `---
apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: newdb-data
spec:
  storageClassName: %s
  accessModes: [ReadWriteOnce]
  resources: {requests: {storage: 1Gi}}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: newdb-cache
spec:
  accessModes: [ReadWriteOnce]
  resources: {requests: {storage: 1Gi}}
---
apiVersion: v1
kind: Secret
metadata:
  name: newdb-credentials
type: Opaque
`
)

func liveObjects(withSecret bool) *fake.Clientset {
	objs := []runtime.Object{
		&corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "olddb-data", Namespace: "data"},
			Spec:   corev1.PersistentVolumeClaimSpec{VolumeName: "pv-1"},
			Status: corev1.PersistentVolumeClaimStatus{Phase: corev1.ClaimBound}},
		&corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "pv-1", UID: types.UID("uid-1")},
			Spec: corev1.PersistentVolumeSpec{StorageClassName: "standard", PersistentVolumeReclaimPolicy: corev1.PersistentVolumeReclaimDelete,
				AccessModes:            []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
				Capacity:               corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")},
				PersistentVolumeSource: corev1.PersistentVolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/data/1"}}}},
	}
	if withSecret {
		objs = append(objs, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "olddb-credentials", Namespace: "data"}, Type: corev1.SecretTypeOpaque,
			Data: map[string][]byte{"username": []byte("u"), "password": []byte("p")}})
	}
	return fake.NewClientset(objs...)
}

func planInput(class string) PlanInput {
	return PlanInput{Old: &release.Release{Name: "olddb", Version: 3, Manifest: oldManifest}, NewRelease: "newdb", NewChart: "newdb",
		NewChartVersion: "2.0.0", NewManifest: strings.Replace(newManifest, "%s", class, 1), Namespace: "data"}
}

func TestMakePlanPairsVolumesAndSecrets(t *testing.T) {
	p, err := MakePlan(t.Context(), liveObjects(true), planInput("standard"))
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Volumes) != 1 || p.Volumes[0].OldPVC != "olddb-data" || p.Volumes[0].NewPVC != "newdb-data" || p.Volumes[0].PVUID != "uid-1" {
		t.Errorf("volumes %+v, want olddb-data -> newdb-data on pv-1", p.Volumes)
	}
	if diff := cmp.Diff([]string{"newdb-cache"}, p.FreshPVCs); diff != "" {
		t.Errorf("fresh claims (-want +got):\n%s", diff)
	}
	if len(p.Secrets) != 1 || p.Secrets[0].New != "newdb-credentials" || strings.Join(p.Secrets[0].Keys, ",") != "password,username" {
		t.Errorf("secrets %+v, want olddb-credentials -> newdb-credentials with its keys (never its data)", p.Secrets)
	}
	if !p.Safe {
		t.Errorf("plan blocked by %+v; a Delete volume is a note (execute patches it to Retain)", p.Blocking())
	}
	checks := map[string]finding.Severity{}
	for _, f := range p.Findings {
		checks[f.Check] = f.Severity
	}
	if checks[CheckNotRetain] != finding.Info || checks[CheckNewPVCUnprovision] != finding.Info {
		t.Errorf("findings %+v, want notes for the Delete volume and the fresh claim", p.Findings)
	}
}

func TestMakePlanBlocks(t *testing.T) {
	p, err := MakePlan(t.Context(), liveObjects(true), planInput("fast"))
	if err != nil {
		t.Fatal(err)
	}
	if p.Safe || len(p.Blocking()) != 1 || p.Blocking()[0].Check != CheckStorageClass {
		t.Errorf("blocking %+v, want the storage class mismatch alone", p.Blocking())
	}

	in := planInput("standard")
	in.NewReleaseExists = true
	if p, err = MakePlan(t.Context(), liveObjects(true), in); err != nil || p.Safe || p.Blocking()[0].Check != CheckNewReleaseInUse {
		t.Errorf("new release name in use: %v %+v", err, p)
	}

	var missing *MissingSecretError
	if _, err := MakePlan(t.Context(), liveObjects(false), planInput("standard")); !errors.As(err, &missing) || missing.Name != "olddb-credentials" {
		t.Errorf("missing Secret: %v, want a MissingSecretError naming it", err)
	}
}

// TestFindingsNameInputs: a finding that an input of the migration resolves names that
// input (Finding.Input), and its text names no front end's flag.
func TestFindingsNameInputs(t *testing.T) {
	in := planInput("standard")
	in.NewReleaseExists = true
	// No new claim or Secret pairs with the old ones: the new chart has no data claim and
	// no Secret.
	in.NewManifest = strings.NewReplacer("newdb-data", "newdb-logs", "kind: Secret", "kind: ConfigMap").Replace(in.NewManifest)
	p, err := MakePlan(t.Context(), liveObjects(true), in)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]*finding.Input{}
	for _, f := range p.Findings {
		got[f.Check] = f.Input
		if strings.Contains(f.Message+f.Remediation, "--") {
			t.Errorf("%s names a flag: %s / %s", f.Check, f.Message, f.Remediation)
		}
	}
	want := map[string]*finding.Input{
		CheckNewReleaseInUse:   {Option: OptionNewRelease, Value: "NAME"},
		CheckPVCUnmapped:       {Option: OptionMapPVC, Value: "olddb-data=NEW-CLAIM"},
		CheckSecretUnmapped:    {Option: OptionMapSecret, Value: "olddb-credentials=NEW-NAME"},
		CheckNewPVCUnprovision: nil,
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("inputs by check (-want +got):\n%s", diff)
	}
}

// TestOpenResumesOnlyItsOwnRecord: Open resumes the record in the backup directory when
// it is the same migration, refuses another migration's record, and never re-plans a
// recorded one (the record's plan was made before anything changed).
func TestOpenResumesOnlyItsOwnRecord(t *testing.T) {
	dir := t.TempDir()
	p, err := MakePlan(t.Context(), liveObjects(true), planInput("standard"))
	if err != nil {
		t.Fatal(err)
	}
	p.Namespace = "data"
	st := NewState(p)
	st.Steps[StepBackup] = StepRecord{Status: StatusDone}
	if err := st.Save(dir); err != nil {
		t.Fatal(err)
	}

	// No sources: a resumed migration must not read the cluster to plan again.
	got, resumed, err := Open(t.Context(), Sources{}, Request{Release: "olddb", NewRelease: "newdb", Namespace: "data", Dir: dir})
	if err != nil || !resumed || !got.Done(StepBackup) || got.Plan.Volumes[0].NewObject == nil {
		t.Fatalf("resume: %v resumed=%v %+v; want the record with its step done and the new claim's object", err, resumed, got)
	}

	var mismatch *RecordMismatchError
	_, _, err = Open(t.Context(), Sources{}, Request{Release: "olddb", NewRelease: "otherdb", Namespace: "data", Dir: dir})
	if !errors.As(err, &mismatch) || mismatch.NewRelease != "newdb" {
		t.Errorf("another migration's record: %v, want a RecordMismatchError naming the recorded one", err)
	}

	if err := os.WriteFile(filepath.Join(dir, StateFile), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := Open(t.Context(), Sources{}, Request{Release: "olddb", NewRelease: "newdb", Namespace: "data", Dir: dir}); err == nil ||
		!strings.Contains(err.Error(), "not a migration record") {
		t.Errorf("a broken record: %v, want it named, not overwritten", err)
	}
}
