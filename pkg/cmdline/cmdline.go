// Package cmdline words every command upgradeguard tells a person to run: its own
// (migrate, check, plan...), and those of kubectl, helm, flux and argocd. Each command is
// a small value with its own fields and a String that words it, so a check report, a
// plan, an admission answer and an error name the same command the same way for the same
// step. It is the one place that words them: hack/cmdliteral (make lint) refuses a
// command literal anywhere else in product code.
//
// A field left empty is left out of the command, unless the command cannot run without
// it: then a placeholder in capitals (NAME, DIR) stands for it where a reader fills it in.
// What the commands say (which annotation keeps a CRD, which sync option) belongs to the
// packages that decide it, which fill these values in.
package cmdline

import (
	"fmt"
	"strconv"
	"strings"
)

// The tools whose commands are worded here.
const (
	upgradeguard = "upgradeguard"
	kubectl      = "kubectl"
	helm         = "helm"
)

// line builds one command: words are appended when set, flags only with a value.
type line struct{ b strings.Builder }

func start(words ...string) *line { return (&line{}).word(words...) }

// word appends the words that are set.
func (l *line) word(words ...string) *line {
	for _, w := range words {
		if w == "" {
			continue
		}
		if l.b.Len() > 0 {
			l.b.WriteByte(' ')
		}
		l.b.WriteString(w)
	}
	return l
}

// flag appends "name value" when value is set.
func (l *line) flag(name, value string) *line {
	if value != "" {
		l.word(name, value)
	}
	return l
}

// on appends name when set is true.
func (l *line) on(name string, set bool) *line {
	if set {
		l.word(name)
	}
	return l
}

func (l *line) String() string { return l.b.String() }

// or returns v, else placeholder when v is empty.
func or(v, placeholder string) string {
	if v == "" {
		return placeholder
	}
	return v
}

// nsName is NAMESPACE/NAME.
func nsName(namespace, name string) string { return namespace + "/" + name }

// ShellWord quotes s for a POSIX shell when it holds more than letters, digits and
// -_.,=/:
func ShellWord(s string) string {
	for _, r := range s {
		plain := r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_.,=/:", r)
		if !plain {
			return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
		}
	}
	return s
}

// upgradeguard's own commands.

// Migrate is `upgradeguard migrate --crd A --crd B` (`--manifests FILE` for the CRDs of
// rendered manifests): it migrates every object to the live storage version and prunes
// storedVersions. With no CRD and no manifests it names the command itself.
type Migrate struct {
	CRDs []string
	// Manifests is the file (- for stdin) of rendered manifests whose CRDs to migrate.
	Manifests string
	// Wait waits for a migration someone else runs.
	Wait bool
	// Engine is --engine (builtin: the API server's StorageVersionMigration).
	Engine string
}

func (c Migrate) String() string {
	l := start(upgradeguard, "migrate")
	for _, n := range c.CRDs {
		l.flag("--crd", n)
	}
	return l.flag("--manifests", c.Manifests).flag("--engine", c.Engine).on("--wait", c.Wait).String()
}

// StorageSwitch is `upgradeguard migrate --crd A --storage-version V
// --allow-storage-switch`: it switches the live storage version to one both sides serve,
// then migrates and prunes.
type StorageSwitch struct {
	CRDs           []string
	StorageVersion string
}

func (c StorageSwitch) String() string {
	return fmt.Sprintf("upgradeguard migrate --crd %s --storage-version %s --allow-storage-switch", strings.Join(c.CRDs, " --crd "), c.StorageVersion)
}

// ReverseMigration is the migration before a rollback: `upgradeguard migrate --rollback
// --release R -n NS --to-revision N --allow-storage-switch` (Revision 0: the previous
// revision).
type ReverseMigration struct {
	Release, Namespace string
	Revision           int
}

func (c ReverseMigration) String() string {
	l := start(upgradeguard, "migrate", "--rollback").flag("--release", c.Release).flag("-n", c.Namespace)
	if c.Revision > 0 {
		l.flag("--to-revision", strconv.Itoa(c.Revision))
	}
	return l.word("--allow-storage-switch").String()
}

// Plan is `upgradeguard plan --release R -n NS --chart C --version V`, each flag only
// when its value is known.
type Plan struct {
	Release, Namespace, Chart, Version string
}

func (c Plan) String() string {
	return start(upgradeguard, "plan").flag("--release", c.Release).flag("-n", c.Namespace).flag("--chart", c.Chart).flag("--version", c.Version).String()
}

// PlanHelmRelease is `upgradeguard plan --helmrelease NS/NAME --version V`: the plan of a
// Flux HelmRelease.
type PlanHelmRelease struct {
	Namespace, Name, Version string
}

func (c PlanHelmRelease) String() string {
	return start(upgradeguard, "plan", "--helmrelease", nsName(c.Namespace, c.Name)).flag("--version", c.Version).String()
}

// PlanApplication is `upgradeguard plan --argocd-app NS/NAME`: the plan of an Argo CD
// Application.
type PlanApplication struct {
	Namespace, Name string
}

func (c PlanApplication) String() string {
	return start(upgradeguard, "plan", "--argocd-app", nsName(c.Namespace, c.Name)).String()
}

// Check is `upgradeguard check --release R -n NS --chart C` (`--manifests FILE` for
// rendered manifests), each flag only when its value is known: Chart may be a
// placeholder the reader replaces. With nothing set it names the command itself.
type Check struct {
	Release, Namespace, Chart string
	Manifests                 string
}

func (c Check) String() string {
	return start(upgradeguard, "check").flag("--release", c.Release).flag("-n", c.Namespace).flag("--chart", c.Chart).flag("--manifests", c.Manifests).String()
}

// CheckApplication is `upgradeguard check --argocd-app NS/NAME`: the check of an Argo CD
// Application's Helm source.
type CheckApplication struct {
	Namespace, Name string
}

func (c CheckApplication) String() string {
	return start(upgradeguard, "check", "--argocd-app", nsName(c.Namespace, c.Name)).String()
}

// CheckApplicationManifests is `argocd app manifests NAME | upgradeguard check
// --manifests -`, NAME prefixed with Namespace/ when Namespace is set: the check of any
// Application, through the manifests Argo CD renders for it.
type CheckApplicationManifests struct {
	Namespace, Name string
}

func (c CheckApplicationManifests) String() string {
	name := c.Name
	if c.Namespace != "" {
		name = nsName(c.Namespace, name)
	}
	return start("argocd", "app", "manifests", name, "|").word(Check{Manifests: "-"}.String()).String()
}

// UninstallBackup is `upgradeguard release uninstall-check R -n NS --backup DIR`: the
// backup of a release's Secrets, claims and volumes before an uninstall.
type UninstallBackup struct {
	Release, Namespace string
	// Dir is the backup directory (DIR when empty).
	Dir string
}

func (c UninstallBackup) String() string {
	return start(upgradeguard, "release", "uninstall-check", c.Release).flag("-n", c.Namespace).flag("--backup", or(c.Dir, "DIR")).String()
}

// ApplyCheck is `upgradeguard release apply-check`: who owns the fields an upgrade
// applies.
type ApplyCheck struct{}

func (ApplyCheck) String() string { return start(upgradeguard, "release", "apply-check").String() }

// CRDBackup is `upgradeguard crd backup A B --dir DIR`: the CRDs and every object of
// their types, restorable with CRDRestore.
type CRDBackup struct {
	CRDs []string
	Dir  string
}

func (c CRDBackup) String() string {
	return start(upgradeguard, "crd", "backup").word(c.CRDs...).flag("--dir", c.Dir).String()
}

// CRDAdopt is `upgradeguard crd adopt CRD --from NS/A --to NS/B --chart C --apply`:
// it moves a CRD's Helm ownership from release A to release B and keeps it on A's side
// (dry run unless Apply), naming B's chart when B is not installed yet.
type CRDAdopt struct {
	CRD                     string
	FromNamespace, FromName string
	ToNamespace, ToName     string
	Chart                   string
	Apply                   bool
}

func (c CRDAdopt) String() string {
	return start(upgradeguard, "crd", "adopt", or(c.CRD, "CRD")).flag("--from", nsName(or(c.FromNamespace, "NAMESPACE"), or(c.FromName, "RELEASE"))).
		flag("--to", nsName(or(c.ToNamespace, "NAMESPACE"), or(c.ToName, "RELEASE"))).flag("--chart", c.Chart).on("--apply", c.Apply).String()
}

// CRDRestore is `upgradeguard crd restore --dir DIR`.
type CRDRestore struct{ Dir string }

func (c CRDRestore) String() string {
	return start(upgradeguard, "crd", "restore").flag("--dir", c.Dir).String()
}

// RBAC is `upgradeguard rbac --crd A --engine E`: the least-privilege role of a
// migration.
type RBAC struct {
	CRDs   []string
	Engine string
}

func (c RBAC) String() string {
	l := start(upgradeguard, "rbac")
	for _, n := range c.CRDs {
		l.flag("--crd", n)
	}
	return l.flag("--engine", c.Engine).String()
}

// APF is `upgradeguard apf` (with Apply: `--apply`): a priority level of migrations' own.
type APF struct{ Apply bool }

func (c APF) String() string { return start(upgradeguard, "apf").on("--apply", c.Apply).String() }

// Audit is `upgradeguard audit` (with Fleet: `--fleet`).
type Audit struct{ Fleet bool }

func (c Audit) String() string { return start(upgradeguard, "audit").on("--fleet", c.Fleet).String() }

// Snapshot is `upgradeguard snapshot -o FILE` (`--push REF` with a Push reference): a
// record of the cluster for a review without credentials.
type Snapshot struct{ Push string }

func (c Snapshot) String() string {
	if c.Push != "" {
		return start(upgradeguard, "snapshot", "--push", c.Push).String()
	}
	return start(upgradeguard, "snapshot", "-o", "FILE").String()
}

// Helm's commands.

// HelmUpgrade is `helm upgrade R CHART --repo URL --version V --plain-http -f FILE -n
// NS`, each flag only when its value is known (CHART when the chart is not); Install
// words `helm upgrade --install`, for a release that may not exist yet. Values set
// inline are never worded. With no release it names the operation itself.
type HelmUpgrade struct {
	Release, Namespace string
	Chart, Repo        string
	Version            string
	PlainHTTP          bool
	ValuesFiles        []string
	Install            bool
}

func (c HelmUpgrade) String() string {
	l := start(helm, "upgrade")
	if c.Release == "" {
		return l.String()
	}
	l.on("--install", c.Install).word(c.Release, or(c.Chart, "CHART")).flag("--repo", c.Repo).flag("--version", c.Version).on("--plain-http", c.PlainHTTP)
	for _, f := range c.ValuesFiles {
		l.flag("-f", f)
	}
	return l.flag("-n", c.Namespace).String()
}

// HelmInstall is `helm install R CHART` (with TakeOwnership: `--take-ownership`).
type HelmInstall struct {
	Release, Chart string
	TakeOwnership  bool
}

func (c HelmInstall) String() string {
	return start(helm, "install", c.Release, c.Chart).on("--take-ownership", c.TakeOwnership).String()
}

// HelmUninstall is `helm uninstall R -n NS` (with no release: the operation itself).
type HelmUninstall struct{ Release, Namespace string }

func (c HelmUninstall) String() string {
	return start(helm, "uninstall", c.Release).flag("-n", c.Namespace).String()
}

// HelmRollback is `helm rollback R N -n NS` (Revision 0: the previous revision; no
// release: the operation itself).
type HelmRollback struct {
	Release, Namespace string
	Revision           int
}

func (c HelmRollback) String() string {
	l := start(helm, "rollback", c.Release)
	if c.Revision > 0 {
		l.word(strconv.Itoa(c.Revision))
	}
	return l.flag("-n", c.Namespace).String()
}

// HelmHistory is `helm history R -n NS`: a release's revisions.
type HelmHistory struct{ Release, Namespace string }

func (c HelmHistory) String() string {
	return start(helm, "history", c.Release).flag("-n", c.Namespace).String()
}

// HelmList is `helm list -n NS`.
type HelmList struct{ Namespace string }

func (c HelmList) String() string { return start(helm, "list").flag("-n", c.Namespace).String() }

// HelmGetManifest is `helm get manifest R -n NS`, piped to `grep Grep` when Grep is set.
type HelmGetManifest struct{ Release, Namespace, Grep string }

func (c HelmGetManifest) String() string {
	l := start(helm, "get", "manifest", c.Release).flag("-n", c.Namespace)
	if c.Grep != "" {
		l.word("|", "grep", c.Grep)
	}
	return l.String()
}

// HelmLint is `helm lint PATH`.
type HelmLint struct{ Path string }

func (c HelmLint) String() string { return start(helm, "lint", c.Path).String() }

// HelmDependencyBuild is `helm dependency build PATH`.
type HelmDependencyBuild struct{ Path string }

func (c HelmDependencyBuild) String() string {
	return start(helm, "dependency", "build", c.Path).String()
}

// HelmDependencyUpdate is `helm dependency update PATH`: resolves Chart.yaml's
// dependencies again and rewrites Chart.lock.
type HelmDependencyUpdate struct{ Path string }

func (c HelmDependencyUpdate) String() string {
	return start(helm, "dependency", "update", c.Path).String()
}

// HelmVersion is `helm version --short`: the version of the Helm that runs.
type HelmVersion struct{}

func (HelmVersion) String() string { return start(helm, "version", "--short").String() }

// HelmRepoAdd is `helm repo add NAME URL --username USER --password-stdin`: a private
// chart repository's credentials in Helm's repositories file.
type HelmRepoAdd struct{ Name, URL string }

func (c HelmRepoAdd) String() string {
	return start(helm, "repo", "add", or(c.Name, "NAME"), or(c.URL, "URL"), "--username", "USER", "--password-stdin").String()
}

// HelmRegistryLogin is `helm registry login HOST`: credentials for an OCI registry in
// Helm's registry config.
type HelmRegistryLogin struct{ Host string }

func (c HelmRegistryLogin) String() string {
	return start(helm, "registry", "login", or(c.Host, "REGISTRY")).String()
}

// kubectl's commands.

// Annotate is `kubectl annotate --overwrite RESOURCE NAME... -n NS KEY=VALUE`
// (Overwrite to replace a value already there), KEY=VALUE quoted for the shell when it
// needs to be, then each of More the same way. Resource may be empty when the names are
// KIND/NAME.
type Annotate struct {
	Resource   string
	Names      []string
	Namespace  string
	Key, Value string
	More       []KeyValue
	Overwrite  bool
}

// KeyValue is one more KEY=VALUE an Annotate sets.
type KeyValue struct{ Key, Value string }

func (c Annotate) String() string {
	l := start(kubectl, "annotate").on("--overwrite", c.Overwrite).word(c.Resource).word(c.Names...).flag("-n", c.Namespace).word(ShellWord(c.Key + "=" + c.Value))
	for _, kv := range c.More {
		l.word(ShellWord(kv.Key + "=" + kv.Value))
	}
	return l.String()
}

// Label is `kubectl label --overwrite RESOURCE NAME... KEY=VALUE` (Overwrite to replace a
// value already there).
type Label struct {
	Resource   string
	Names      []string
	Key, Value string
	Overwrite  bool
}

func (c Label) String() string {
	return start(kubectl, "label").on("--overwrite", c.Overwrite).word(c.Resource).word(c.Names...).word(ShellWord(c.Key + "=" + c.Value)).String()
}

// Get is `kubectl get RESOURCE NAME -n NS -A -o OUTPUT`, each part only when set.
type Get struct {
	Resource, Name, Namespace string
	AllNamespaces             bool
	Output                    string
}

func (c Get) String() string {
	return start(kubectl, "get", c.Resource, c.Name).flag("-n", c.Namespace).on("-A", c.AllNamespaces).flag("-o", c.Output).String()
}

// Describe is `kubectl describe RESOURCE NAME -n NS`.
type Describe struct{ Resource, Name, Namespace string }

func (c Describe) String() string {
	return start(kubectl, "describe", c.Resource, c.Name).flag("-n", c.Namespace).String()
}

// Edit is `kubectl edit RESOURCE NAME -n NS`.
type Edit struct{ Resource, Name, Namespace string }

func (c Edit) String() string {
	return start(kubectl, "edit", c.Resource, c.Name).flag("-n", c.Namespace).String()
}

// Delete is `kubectl delete RESOURCE NAME -n NS` (DryRunServer: `--dry-run=server`, which
// shows what the API server answers without deleting).
type Delete struct {
	Resource, Name, Namespace string
	DryRunServer              bool
}

func (c Delete) String() string {
	return start(kubectl, "delete", c.Resource, c.Name).flag("-n", c.Namespace).on("--dry-run=server", c.DryRunServer).String()
}

// DeleteObjects is `kubectl delete A,B --all --all-namespaces`: every object of the CRDs'
// types (a CRD's name is its resource and group).
type DeleteObjects struct{ CRDs []string }

func (c DeleteObjects) String() string {
	return start(kubectl, "delete", strings.Join(c.CRDs, ","), "--all", "--all-namespaces").String()
}

// WaitDeleted is `kubectl wait --for=delete RESOURCE/NAME`.
type WaitDeleted struct{ Resource, Name string }

func (c WaitDeleted) String() string {
	return start(kubectl, "wait", "--for=delete", c.Resource+"/"+c.Name).String()
}

// JobLogs is `kubectl -n NS logs job/NAME`.
type JobLogs struct{ Namespace, Job string }

func (c JobLogs) String() string {
	return start(kubectl, "-n", c.Namespace, "logs", "job/"+c.Job).String()
}

// Apply is `kubectl apply --server-side -f FILE` (with no file: the command itself).
type Apply struct {
	File       string
	ServerSide bool
}

func (c Apply) String() string {
	return start(kubectl, "apply").on("--server-side", c.ServerSide).flag("-f", c.File).String()
}

// CreateNamespace is `kubectl create namespace NAME`.
type CreateNamespace struct{ Name string }

func (c CreateNamespace) String() string {
	return start(kubectl, "create", "namespace", or(c.Name, "NAME")).String()
}

// RetainVolume is `kubectl patch pv NAME -p '{"spec":{"persistentVolumeReclaimPolicy":"Retain"}}'`:
// the volume outlives its claim.
type RetainVolume struct{ PersistentVolume string }

func (c RetainVolume) String() string {
	return start(kubectl, "patch", "pv", c.PersistentVolume, "-p", `'{"spec":{"persistentVolumeReclaimPolicy":"Retain"}}'`).String()
}

// Flux's and Argo CD's commands.

// HelmReleaseVersion moves a Flux HelmRelease NS/NAME to a chart version: the value to
// commit, and the kubectl patch that does the same on the cluster.
type HelmReleaseVersion struct{ Namespace, Name, Version string }

func (c HelmReleaseVersion) String() string {
	return fmt.Sprintf(`commit spec.chart.spec.version: %q to HelmRelease %s (or: kubectl patch helmrelease %s -n %s --type merge -p '{"spec":{"chart":{"spec":{"version":%q}}}}')`,
		c.Version, nsName(c.Namespace, c.Name), c.Name, c.Namespace, c.Version)
}

// Reconcile is `flux reconcile helmrelease NAME -n NS --reset`: helm-controller retries
// at once (Reset: after its retries ran out).
type Reconcile struct {
	Namespace, Name string
	Reset           bool
}

func (c Reconcile) String() string {
	return start("flux", "reconcile", "helmrelease", c.Name).flag("-n", c.Namespace).on("--reset", c.Reset).String()
}

// ApplicationRevision moves an Argo CD Application NS/NAME to a chart version: the
// targetRevision to commit, and the argocd command that sets it (at SourcePosition, the
// 1-based position of the Helm source in spec.sources; 0 for spec.source).
type ApplicationRevision struct {
	Namespace, Name string
	Version         string
	SourcePosition  int
}

func (c ApplicationRevision) String() string {
	set := start("argocd", "app", "set", nsName(c.Namespace, c.Name))
	if c.SourcePosition > 0 {
		set.flag("--source-position", strconv.Itoa(c.SourcePosition))
	}
	set.flag("--revision", c.Version)
	return fmt.Sprintf(`commit targetRevision: %q to the Helm source of Application %s (or: %s)`, c.Version, nsName(c.Namespace, c.Name), set)
}

// Sync is `argocd app sync` (with Prune: `--prune`, which deletes what left the
// Application).
type Sync struct{ Prune bool }

func (c Sync) String() string { return start("argocd", "app", "sync").on("--prune", c.Prune).String() }

// RepoAdd is `argocd repo add URL --type TYPE`, with the flags Argo CD needs for the
// repository: Credentials (`--username USER --password PASSWORD`), EnableOCI
// (`--enable-oci`, a Helm repository on an OCI registry) and InsecureOCI
// (`--insecure-oci-force-http`).
type RepoAdd struct {
	URL, Type                         string
	Credentials, EnableOCI, PlainHTTP bool
}

func (c RepoAdd) String() string {
	l := start("argocd", "repo", "add", c.URL).flag("--type", c.Type)
	if c.Credentials {
		l.word("--username", "USER", "--password", "PASSWORD")
	}
	return l.on("--enable-oci", c.EnableOCI).on("--insecure-oci-force-http", c.PlainHTTP).String()
}
