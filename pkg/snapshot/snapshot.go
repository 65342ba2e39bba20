// Package snapshot owns a record of a cluster's state taken where credentials exist, so
// that a prediction can be made where none do (review in CI): per CRD its spec, storage,
// storedVersions, conversion, object count and the field paths its objects hold, counted,
// never a value; the Helm releases with their charts, statuses and the CRDs their current
// revision carries; which Flux HelmReleases and Argo CD Applications track them, with
// what each Application deployed and the CRDs it manages, and how Argo CD tracks them
// (argocd-cm's tracking entries); and the server's version. No repository credentials:
// a chart is fetched where the snapshot is read, with the Helm settings there. It holds no object name (but the CRDs', the releases' and the
// deployments'), no field value, no Secret data and no release values.
//
// A Snapshot is a check.Cluster (and fluxrelease.Recorded): check reads it through the one
// code path it reads a live cluster through, so the verdicts are the same.
package snapshot

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	apiextv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"

	"github.com/upgradeguard/upgradeguard/pkg/argoapp"
	"github.com/upgradeguard/upgradeguard/pkg/crdschema"
)

// SchemaVersion is the format this package writes and the only one it reads. A field
// added to the format without changing what the others mean keeps the version, so that
// an older upgradeguard still reads the snapshot; the field is then optional, and a
// reader that needs it says when a snapshot predates it (ArgoCD).
const SchemaVersion = 1

// MediaType is a snapshot's type as an OCI artifact.
const MediaType = "application/vnd.upgradeguard.snapshot.v1+json"

// Snapshot is one cluster's state at TakenAt.
type Snapshot struct {
	SchemaVersion int       `json:"schemaVersion"`
	TakenAt       time.Time `json:"takenAt"`
	// Took is how long taking it took.
	Took   Duration `json:"took"`
	Server Server   `json:"server"`
	CRDs   []CRD    `json:"crds"`
	// Releases are the Helm releases stored in Secrets (Helm's and helm-controller's
	// default driver), sorted by namespace and name.
	Releases []Release `json:"releases"`
	// HelmReleases and Applications are what Flux and Argo CD track; none when their
	// APIs are not served.
	HelmReleases []HelmRelease `json:"helmReleases,omitempty"`
	Applications []Application `json:"applications,omitempty"`
	// ArgoCD is what a prediction of an Argo CD sync reads of Argo CD itself. Every
	// snapshot has it but those taken before upgradeguard recorded it (and the
	// Applications' status): nil says so.
	ArgoCD *ArgoCD `json:"argoCD,omitempty"`
}

// ArgoCD is Argo CD's installation as a prediction reads it.
type ArgoCD struct {
	// Namespace is where Argo CD runs and keeps its settings (argoapp.DefaultNamespace).
	Namespace string `json:"namespace"`
	// Settings are the entries of its argocd-cm that say how it tracks an Application's
	// objects, and nothing else of argocd-cm; nil when argocd-cm could not be read
	// (forbidden), which counts every CRD of an Application's resource tree as tracked,
	// as a live prediction does.
	Settings *argoapp.Settings `json:"settings,omitempty"`
}

// Server is the API server.
type Server struct {
	// Version is its git version (v1.37.0); Minor its Kubernetes minor.
	Version string `json:"version"`
	Minor   int    `json:"minor"`
}

// CRD is one CustomResourceDefinition as the verdicts read it.
type CRD struct {
	Name string `json:"name"`
	// Labels and Annotations are those the verdicts read: Helm's ownership and keep
	// policy, Argo CD's tracking and sync options, upgradeguard's own (KeptMetadata).
	Labels      map[string]string `json:"labels,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
	// Spec holds the group, names, scope, versions (served, storage, schemas) and
	// conversion, with a conversion webhook's caBundle left out.
	Spec           apiextv1.CustomResourceDefinitionSpec `json:"spec"`
	StoredVersions []string                              `json:"storedVersions"`
	// Objects is how many objects of its type exist; ObjectsError says why they could
	// not be counted (Objects is then 0).
	Objects      int64  `json:"objects"`
	ObjectsError string `json:"objectsError,omitempty"`
	// Fields are, by served version, the field paths the objects hold read at it, with
	// how many hold each. FieldsError says why they could not be read.
	Fields      map[string][]crdschema.FieldPath `json:"fields,omitempty"`
	FieldsError string                           `json:"fieldsError,omitempty"`
}

// Release is one Helm release.
type Release struct {
	Name      string `json:"name"`
	Namespace string `json:"namespace"`
	// Revisions are its stored revisions, oldest first.
	Revisions []Revision `json:"revisions"`
	// Current is the revision an upgrade starts from (helmrelease.Deployed), and CRDs
	// the CRDs it carries.
	Current int          `json:"current"`
	CRDs    []ReleaseCRD `json:"crds,omitempty"`
}

// Revision is one stored revision of a release.
type Revision struct {
	Revision int    `json:"revision"`
	Chart    string `json:"chart"`
	Version  string `json:"version"`
	Status   string `json:"status"`
}

// ReleaseCRD is a CRD a release's revision carries: in its chart's crds/ folder or
// rendered from templates/ into its manifest, with the annotations the manifest gives it
// (its keep policy, KeptMetadata).
type ReleaseCRD struct {
	Name string `json:"name"`
	// Versions are its versions, Storage the one it stores at, as the revision gives them.
	Versions []string `json:"versions"`
	Storage  string   `json:"storage"`
	// File is where the chart holds it (lws/crds/x.yaml, or the template it renders
	// from).
	File string `json:"file"`
	// Source is crds/ or templates/ (predict.CRDsDir, predict.Templates).
	Source      string            `json:"source"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

// HelmRelease is a Flux HelmRelease and the Helm release it tracks.
type HelmRelease struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	// Release and StorageNamespace name the Helm release (status.storageNamespace and
	// the history's last entry, else the spec's rule).
	Release          string `json:"release,omitempty"`
	StorageNamespace string `json:"storageNamespace,omitempty"`
	Chart            string `json:"chart,omitempty"`
	Version          string `json:"version,omitempty"`
	Ready            string `json:"ready,omitempty"`
}

// Application is an Argo CD Application: its name, its Helm source as the live
// Application gives it, and the part of its status a prediction reads.
type Application struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	// RepoURL (without credentials or a query), Chart (or Path, a chart in a git
	// repository) and TargetRevision are its Helm source (argoapp.Application.HelmSource),
	// empty when it has none.
	RepoURL        string `json:"repoURL,omitempty"`
	Chart          string `json:"chart,omitempty"`
	Path           string `json:"path,omitempty"`
	TargetRevision string `json:"targetRevision,omitempty"`
	// Destination is the namespace it deploys to.
	Destination string `json:"destination,omitempty"`
	// Sync is status.sync.status.
	Sync string `json:"sync,omitempty"`
	// Status is what it deployed and manages now (argoapp.Status.Recorded): the synced
	// revisions, the newest history entry, the CRDs of its resource tree.
	Status argoapp.Status `json:"status,omitzero"`
}

// Application is the Application namespace/name as the snapshot recorded it; nil when it
// was not on the cluster.
func (s *Snapshot) Application(namespace, name string) *Application {
	for i := range s.Applications {
		if a := &s.Applications[i]; a.Namespace == namespace && a.Name == name {
			return a
		}
	}
	return nil
}

// Duration is a time.Duration written as Go spells it (1.5s).
type Duration time.Duration

// MarshalJSON writes the duration as a string.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// UnmarshalJSON reads a duration string.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return err
	}
	v, err := time.ParseDuration(s)
	*d = Duration(v)
	return err
}

// Age is how old the snapshot is at now.
func (s *Snapshot) Age(now time.Time) time.Duration { return now.Sub(s.TakenAt) }

// Write writes the snapshot as indented JSON.
func (s *Snapshot) Write(w io.Writer) error {
	e := json.NewEncoder(w)
	e.SetIndent("", "  ")
	return e.Encode(s)
}

// VersionError says a snapshot is in a format this build does not read.
type VersionError struct{ Version int }

func (e *VersionError) Error() string {
	if e.Version > SchemaVersion {
		return fmt.Sprintf("snapshot schemaVersion %d is newer than this upgradeguard reads (%d): upgrade upgradeguard, or take the snapshot with the same version", e.Version, SchemaVersion)
	}
	return fmt.Sprintf("snapshot schemaVersion %d is not one this upgradeguard reads (%d): take the snapshot again with this version", e.Version, SchemaVersion)
}

// Read reads a snapshot and checks its format version.
func Read(r io.Reader) (*Snapshot, error) {
	var head struct {
		SchemaVersion *int `json:"schemaVersion"`
	}
	b, err := io.ReadAll(r)
	if err != nil {
		return nil, err
	}
	if err := json.Unmarshal(b, &head); err != nil {
		return nil, fmt.Errorf("not a snapshot (JSON): %w", err)
	}
	if head.SchemaVersion == nil {
		return nil, errors.New("not a snapshot: it has no schemaVersion (take one with the snapshot command)")
	}
	if *head.SchemaVersion != SchemaVersion {
		return nil, &VersionError{Version: *head.SchemaVersion}
	}
	s := &Snapshot{}
	if err := json.Unmarshal(b, s); err != nil {
		return nil, fmt.Errorf("snapshot: %w", err)
	}
	return s, nil
}
