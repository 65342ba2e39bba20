package argoapp

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

func app(spec Spec) *Application {
	return &Application{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "argocd"}, Spec: spec}
}

func TestHelmSource(t *testing.T) {
	raw := &runtime.RawExtension{Raw: []byte(`{}`)}
	chart := Source{RepoURL: "https://charts.example.com", Chart: "web", TargetRevision: "1.2.3"}
	for _, tc := range []struct {
		name        string
		spec        Spec
		want        *Source
		unsupported string // part of the reason
	}{
		{name: "spec.source", spec: Spec{Source: &chart}, want: &chart},
		{name: "spec.sources with a ref-only values source", spec: Spec{Sources: []Source{{RepoURL: "https://git.example.com/values", Ref: "values"}, chart}}, want: &chart},
		{name: "no source", spec: Spec{}, unsupported: "no source names a Helm chart"},
		{name: "two rendering sources", spec: Spec{Sources: []Source{chart, {RepoURL: "https://git.example.com/app", Path: "deploy"}}}, unsupported: "2 sources render"},
		{name: "kustomize", spec: Spec{Source: &Source{RepoURL: "https://git.example.com/app", Path: "k", Kustomize: raw}}, unsupported: "Kustomize"},
		{name: "plugin", spec: Spec{Source: &Source{RepoURL: "https://git.example.com/app", Path: "p", Plugin: raw}}, unsupported: "plugin"},
		{name: "directory", spec: Spec{Source: &Source{RepoURL: "https://git.example.com/app", Path: "d", Directory: raw}}, unsupported: "directory"},
		{name: "no repoURL", spec: Spec{Source: &Source{Chart: "web"}}, unsupported: "no repoURL"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := app(tc.spec).HelmSource()
			if tc.unsupported != "" {
				var u *UnsupportedError
				if !errors.As(err, &u) || !strings.Contains(u.Reason, tc.unsupported) {
					t.Fatalf("error %v, want an UnsupportedError about %q", err, tc.unsupported)
				}
				if want := "argocd app manifests web | upgradeguard check --manifests -"; u.Instead != want {
					t.Errorf("instead %q, want %q", u.Instead, want)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("source (-want +got):\n%s", diff)
			}
		})
	}
}

func TestManifestsCommandOtherNamespace(t *testing.T) {
	a := &Application{ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "team-a"}}
	if got, want := ManifestsCommand(a), "argocd app manifests team-a/web | upgradeguard check --manifests -"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

func TestChartRef(t *testing.T) {
	for _, tc := range []struct {
		repoURL, chart string
		kind           Kind
		ref, repo      string
	}{
		{"https://charts.example.com", "web", HelmRepository, "web", "https://charts.example.com"},
		{"http://127.0.0.1:8080/", "web", HelmRepository, "web", "http://127.0.0.1:8080/"},
		{"oci://ghcr.io/org/charts", "web", OCI, "oci://ghcr.io/org/charts/web", ""},
		{"oci://ghcr.io/org/charts/", "web", OCI, "oci://ghcr.io/org/charts/web", ""},
		// Argo CD writes OCI Helm repositories as a bare host and path (enableOCI).
		{"ghcr.io/org/charts", "web", OCI, "oci://ghcr.io/org/charts/web", ""},
		{"registry-1.docker.io/bitnamicharts", "redis", OCI, "oci://registry-1.docker.io/bitnamicharts/redis", ""},
	} {
		kind, ref, repo := chartRef(tc.repoURL, tc.chart)
		if kind != tc.kind || ref != tc.ref || repo != tc.repo {
			t.Errorf("chartRef(%q, %q) = %s %q %q, want %s %q %q", tc.repoURL, tc.chart, kind, ref, repo, tc.kind, tc.ref, tc.repo)
		}
	}
}

func TestSetParameters(t *testing.T) {
	set, setString := setParameters([]Parameter{
		{Name: "image.tag", Value: "1.2"},
		{Name: "hosts", Value: "a.example.com,b.example.com"},
		{Name: "list", Value: "{a,b}"},
		{Name: "escaped", Value: `x\,y`},
		{Name: "port", Value: "8080", ForceString: true},
	})
	if diff := cmp.Diff([]string{"image.tag=1.2", `hosts=a.example.com\,b.example.com`, "list={a,b}", `escaped=x\,y`}, set); diff != "" {
		t.Errorf("--set (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"port=8080"}, setString); diff != "" {
		t.Errorf("--set-string (-want +got):\n%s", diff)
	}
}

func TestMatchSecret(t *testing.T) {
	secret := func(name, typ, url string) corev1.Secret {
		return corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "argocd", Labels: map[string]string{SecretTypeLabel: typ}},
			Data: map[string][]byte{"url": []byte(url)}}
	}
	all := []corev1.Secret{
		secret("org", "repo-creds", "https://git.example.com/org"),
		secret("org-team", "repo-creds", "https://git.example.com/org/team"),
		secret("app", "repository", "https://git.example.com/org/app.git"),
		secret("oci", "repository", "ghcr.io/org/charts"),
		secret("other", "cluster", "https://git.example.com/org/team/x"),
	}
	for _, tc := range []struct{ url, want string }{
		{"https://git.example.com/org/app", "app"},
		{"https://git.example.com/org/app.git/", "app"},
		{"https://git.example.com/org/team/x", "org-team"},
		{"https://git.example.com/org/y", "org"},
		{"oci://ghcr.io/org/charts", "oci"},
		{"https://elsewhere.example.com/org/app", ""},
	} {
		got := ""
		if s := matchSecret(all, tc.url); s != nil {
			got = s.Name
		}
		if got != tc.want {
			t.Errorf("%s: secret %q, want %q", tc.url, got, tc.want)
		}
	}
}

func TestFromSecret(t *testing.T) {
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "app", Namespace: "argocd", UID: "u1", ResourceVersion: "7"},
		Data: map[string][]byte{"username": []byte("dev"), "password": []byte("s3cret"), "insecure": []byte("true")}}
	c, err := fromSecret(s)
	if err != nil || c.username != "dev" || c.password != "s3cret" || !c.insecure || c.secret != "argocd/app" || c.id != "argocd/app/u1/7" {
		t.Fatalf("credentials %+v, %v", c, err)
	}
	ssh := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "ssh", Namespace: "argocd"}, Data: map[string][]byte{"sshPrivateKey": []byte("KEY")}}
	_, err = fromSecret(ssh)
	var u *unusableError
	if !errors.As(err, &u) || !strings.Contains(err.Error(), "sshPrivateKey") || strings.Contains(err.Error(), "KEY") {
		t.Fatalf("error %v, want one naming sshPrivateKey and never the key", err)
	}
}

// TestDeployed: the chart version Argo CD last deployed comes from the newest history
// entry (a failed sync adds none), else from a Synced sync status; per source for
// spec.sources; never from a git source, whose revision is a commit.
func TestDeployed(t *testing.T) {
	chart := Source{RepoURL: "https://charts.example.com", Chart: "web", TargetRevision: "~1.3"}
	values := Source{RepoURL: "https://git.example.com/values.git", Ref: "values"}
	git := Source{RepoURL: "https://git.example.com/charts.git", Path: "web", TargetRevision: "main"}
	single := func(st Status) *Application { a := app(Spec{Source: &chart}); a.Status = st; return a }
	synced := func(rev string, revs ...string) Status {
		var st Status
		st.Sync.Status, st.Sync.Revision, st.Sync.Revisions = "Synced", rev, revs
		return st
	}
	for _, tc := range []struct {
		name       string
		app        *Application
		want, from string
	}{
		{"newest history entry", single(Status{History: []HistoryEntry{{Revision: "1.2.0"}, {Revision: "1.2.3"}}}), "1.2.3", FromHistory},
		{"history wins over a sync revision that failed", func() *Application {
			st := synced("1.3.0")
			st.Sync.Status = "OutOfSync"
			st.History = []HistoryEntry{{Revision: "1.2.3"}}
			return single(st)
		}(), "1.2.3", FromHistory},
		{"synced without history", single(synced("1.2.3")), "1.2.3", FromSyncRevision},
		{"out of sync without history", func() *Application { st := synced("1.2.3"); st.Sync.Status = "OutOfSync"; return single(st) }(), "", ""},
		{"multi-source: the chart's position", func() *Application {
			a := app(Spec{Sources: []Source{values, chart}})
			a.Status.History = []HistoryEntry{{Revisions: []string{"0123abc", "1.2.3"}}}
			return a
		}(), "1.2.3", FromHistory},
		{"multi-source synced", func() *Application {
			a := app(Spec{Sources: []Source{values, chart}})
			a.Status = synced("", "0123abc", "1.2.3")
			return a
		}(), "1.2.3", FromSyncRevision},
		{"git source: a commit is no chart version", func() *Application {
			a := app(Spec{Source: &git})
			a.Status.History = []HistoryEntry{{Revision: "0123abc"}}
			return a
		}(), "", ""},
		{"never synced", single(Status{}), "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, from := tc.app.Deployed()
			if got != tc.want || from != tc.from {
				t.Errorf("Deployed() = %q, %q; want %q, %q", got, from, tc.want, tc.from)
			}
		})
	}
}

// TestStatusRecorded: the status a snapshot records keeps what Deployed and ManagedCRDs
// read (the sync state, the newest history entry, the CRDs of the resource tree) and
// nothing else: no condition message, no older entry, no other resource's name.
func TestStatusRecorded(t *testing.T) {
	chart := Source{RepoURL: "https://charts.example.com", Chart: "web", TargetRevision: "1.3.0"}
	values := Source{RepoURL: "https://git.example.com/values.git", Ref: "values"}
	a := app(Spec{Sources: []Source{values, chart}})
	a.Status.Sync.Status, a.Status.Sync.Revision, a.Status.Sync.Revisions = "OutOfSync", "", []string{"0123abc", "1.3.0"}
	a.Status.History = []HistoryEntry{{Revisions: []string{"0000aaa", "1.2.0"}}, {Revisions: []string{"0123abc", "1.2.3"}}}
	a.Status.Conditions = []Condition{{Type: "SyncError", Message: "secret value in a message"}}
	a.Status.Resources = []ResourceStatus{
		{Group: CRDGroup, Version: "v1", Kind: CRDKind, Name: "widgets.example.com", Status: "Synced"},
		{Group: "apps", Version: "v1", Kind: "Deployment", Namespace: "web", Name: "secret-name"},
		{Version: "v1", Kind: "ConfigMap", Namespace: "web", Name: "other-name"},
	}
	var want Status
	want.Sync = a.Status.Sync
	want.History = []HistoryEntry{{Revisions: []string{"0123abc", "1.2.3"}}}
	want.Resources = []ResourceStatus{{Group: CRDGroup, Version: "v1", Kind: CRDKind, Name: "widgets.example.com", Status: "Synced"}}
	got := a.Status.Recorded()
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Recorded() (-want +got):\n%s", diff)
	}
	r := *a
	r.Status = got
	rev, from := r.Deployed()
	wantRev, wantFrom := a.Deployed()
	if rev != wantRev || from != wantFrom || !slices.Equal(r.ManagedCRDs(), a.ManagedCRDs()) || rev != "1.2.3" {
		t.Errorf("from the recorded status: deployed %q (%s), CRDs %v; from the status: %q (%s), %v", rev, from, r.ManagedCRDs(), wantRev, wantFrom, a.ManagedCRDs())
	}
}
