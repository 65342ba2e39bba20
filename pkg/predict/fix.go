package predict

import (
	"fmt"
	"strings"
)

// Fix is what makes one finding safe. Whatever turns a verdict into next steps does it
// through FixFor: check's actions and next steps, plan's steps, the outcome gate.Judge
// gives each finding (a migration it may start, or what blocks it), and the migrations
// migrate.TargetsFor picks from a report, so that each door gives the same advice for the
// same finding.
type Fix string

const (
	// NoFix is the fix of an ok finding: there is nothing to do.
	NoFix Fix = ""
	// FixMigrate migrates every object to the live storage version and prunes
	// storedVersions (CommandMigrate). It is the only fix a tool may carry out unattended.
	FixMigrate Fix = "migrate"
	// FixKeep annotates the live CRD so that the deployer leaves it and its objects
	// (Deployer.KeepCommands: helm.sh/resource-policy=keep for Helm, CommandKeep; the
	// Prune=false sync option for Argo CD, CommandArgoSyncOption).
	FixKeep Fix = "keep"
	// FixStorageSwitch switches the live storage version to Finding.StorageSwitchTo (served
	// by both sides), then migrates and prunes (CommandStorageSwitch, or
	// CommandReverseMigration before a rollback).
	FixStorageSwitch Fix = "storage-switch"
	// FixSteppingStone goes through a chart version whose CRD keeps the live storage
	// version and stores at one the incoming CRD serves, migrating before and after it.
	// A rollback cannot take it: its target is a fixed revision.
	FixSteppingStone Fix = "stepping-stone"
	// FixSchema changes the incoming schema so that it keeps what stored objects hold, or
	// accepts the loss (CommandAllowFieldLoss). No migration helps.
	FixSchema Fix = "schema"
	// FixChart moves to a chart whose CRDs the target API server accepts (or upgrades the
	// control plane to a minor that accepts them first). No migration helps.
	FixChart Fix = "chart"
)

// FixFor returns what fixes a finding.
func FixFor(f Finding) Fix {
	switch f.Verdict {
	case Migrate:
		return FixMigrate
	case Delete, Prune:
		return FixKeep
	case DataLoss:
		return FixSchema
	case Refused:
		return FixChart
	case Bridge:
		if f.StorageSwitchTo != "" {
			return FixStorageSwitch
		}
		return FixSteppingStone
	}
	return NoFix
}

// Automatic reports whether a tool may carry the fix out unattended: a migration changes
// where objects are stored, never what they hold or which chart runs.
func (f Fix) Automatic() bool { return f == FixMigrate }

// CommandKind names one command that a report, a plan step or a denial tells a person to
// run.
type CommandKind string

const (
	// CommandMigrate is `upgradeguard migrate --crd A --crd B` (with Wait: `--wait`).
	CommandMigrate CommandKind = "migrate"
	// CommandStorageSwitch is `upgradeguard migrate --crd A --storage-version V
	// --allow-storage-switch`.
	CommandStorageSwitch CommandKind = "storage-switch"
	// CommandReverseMigration is the migration before a rollback: `upgradeguard migrate
	// --rollback --release R -n NS --to-revision N --allow-storage-switch`.
	CommandReverseMigration CommandKind = "reverse-migration"
	// CommandKeep is `kubectl annotate crd A B helm.sh/resource-policy=keep`.
	CommandKeep CommandKind = "keep"
	// CommandAllowFieldLoss is `kubectl annotate crd A upgradeguard.io/allow-field-loss=true`.
	CommandAllowFieldLoss CommandKind = "allow-field-loss"
	// CommandPlan is `upgradeguard plan --release R -n NS --chart C --version V`, each flag
	// only when its value is known.
	CommandPlan CommandKind = "plan"
	// CommandCheck is `upgradeguard check --release R -n NS --chart C`, C a placeholder
	// the reader replaces when the chart is not known.
	CommandCheck CommandKind = "check"
	// CommandPlanHelmRelease is `upgradeguard plan --helmrelease NS/NAME --version V`.
	CommandPlanHelmRelease CommandKind = "plan-helmrelease"
	// CommandPlanApplication is `upgradeguard plan --argocd-app NS/NAME` (Namespace,
	// Release).
	CommandPlanApplication CommandKind = "plan-application"
	// CommandHelmUpgrade is `helm upgrade R CHART --repo URL --version V --plain-http -f
	// FILE -n NS`, each flag only when its value is known (CHART when the chart is not).
	CommandHelmUpgrade CommandKind = "helm-upgrade"
	// CommandHelmRollback is `helm rollback R N -n NS`.
	CommandHelmRollback CommandKind = "helm-rollback"
	// CommandHelmReleaseVersion moves a Flux HelmRelease NS/NAME to a chart version: the
	// value to commit, and the kubectl patch that does the same on the cluster.
	CommandHelmReleaseVersion CommandKind = "helmrelease-version"
	// CommandApplicationRevision moves an Argo CD Application NS/NAME (Namespace, Release)
	// to a chart version: the targetRevision to commit, and the argocd command that sets it.
	CommandApplicationRevision CommandKind = "application-revision"
	// CommandCheckApplication is `upgradeguard check --argocd-app NS/NAME` (Namespace,
	// Release): the check of an Argo CD Application's Helm source.
	CommandCheckApplication CommandKind = "check-application"
	// CommandCheckApplicationManifests is `argocd app manifests NAME | upgradeguard check
	// --manifests -`, NAME prefixed with Namespace/ when Namespace is set: the check of any
	// Application, through the manifests Argo CD renders for it.
	CommandCheckApplicationManifests CommandKind = "check-application-manifests"
	// CommandUninstallBackup is `upgradeguard release uninstall-check R -n NS --backup
	// DIR`: the backup of a release's Secrets, claims and volumes before an uninstall.
	CommandUninstallBackup CommandKind = "uninstall-backup"
	// CommandCRDBackup is `upgradeguard crd backup A B --dir DIR`: the CRDs and every
	// object of their types, restorable with CommandCRDRestore.
	CommandCRDBackup CommandKind = "crd-backup"
	// CommandCRDRestore is `upgradeguard crd restore --dir DIR`.
	CommandCRDRestore CommandKind = "crd-restore"
	// CommandDeleteObjects is `kubectl delete A,B --all --all-namespaces`: every object of
	// the CRDs' types (a CRD's name is its resource and group).
	CommandDeleteObjects CommandKind = "delete-objects"
	// CommandAllowDelete is `kubectl annotate crd A upgradeguard.io/allow-delete=true`.
	CommandAllowDelete CommandKind = "allow-delete"
	// CommandArgoSyncOption adds SyncOption (Prune=false, Delete=false) to the CRDs'
	// Argo CD sync-options annotation: `kubectl annotate crd A B
	// argocd.argoproj.io/sync-options=Prune=false`, which refuses to replace a value
	// already there; with ExistingSyncOptions (the one CRD's value today), `kubectl
	// annotate --overwrite crd A argocd.argoproj.io/sync-options=ServerSideApply=true,Prune=false`,
	// the existing options kept (MergeSyncOptions).
	CommandArgoSyncOption CommandKind = "argocd-sync-option"
)

// Command is one command to run. String words it: it is the one place that does, so a
// check report, a plan and an admission denial name the same command for the same step.
type Command struct {
	Kind CommandKind
	// CRDs are the CRDs the command acts on (migrate, storage switch, keep, field loss).
	CRDs []string
	// Wait, for CommandMigrate, waits for a migration someone else runs.
	Wait bool
	// StorageVersion is the version a storage switch moves to.
	StorageVersion string
	// Release and Namespace name the Helm release (a HelmRelease's name and namespace for
	// CommandPlanHelmRelease and CommandHelmReleaseVersion; an Argo CD Application's for
	// CommandPlanApplication, CommandApplicationRevision and the CommandCheckApplication
	// kinds).
	Release, Namespace string
	// Chart and ChartVersion name the chart a plan or an upgrade moves to.
	Chart, ChartVersion string
	// Repo, PlainHTTP and ValuesFiles are the chart repository, its plain-HTTP access and
	// the values files of a Helm upgrade (values set inline are never worded).
	Repo        string
	PlainHTTP   bool
	ValuesFiles []string
	// Revision is the release revision a rollback or reverse migration moves to (0: the
	// previous one, for a reverse migration).
	Revision int
	// SourcePosition is the 1-based position of the Helm source in an Argo CD
	// Application's spec.sources (CommandApplicationRevision); 0 for spec.source.
	SourcePosition int
	// Dir is the directory a CRD backup is written to and restored from.
	Dir string
	// SyncOption is the Argo CD sync option CommandArgoSyncOption adds, and
	// ExistingSyncOptions the value of the CRD's sync-options annotation it merges with.
	SyncOption, ExistingSyncOptions string
}

// String words the command.
func (c Command) String() string {
	var b strings.Builder
	switch c.Kind {
	case CommandMigrate:
		b.WriteString("upgradeguard migrate")
		for _, n := range c.CRDs {
			b.WriteString(" --crd " + n)
		}
		if c.Wait {
			b.WriteString(" --wait")
		}
	case CommandStorageSwitch:
		fmt.Fprintf(&b, "upgradeguard migrate --crd %s --storage-version %s --allow-storage-switch", strings.Join(c.CRDs, " --crd "), c.StorageVersion)
	case CommandReverseMigration:
		b.WriteString("upgradeguard migrate --rollback --release " + c.Release + nsFlag(c.Namespace))
		if c.Revision > 0 {
			fmt.Fprintf(&b, " --to-revision %d", c.Revision)
		}
		b.WriteString(" --allow-storage-switch")
	case CommandKeep:
		fmt.Fprintf(&b, "kubectl annotate crd %s %s=%s", strings.Join(c.CRDs, " "), KeepAnnotation, KeepValue)
	case CommandAllowFieldLoss:
		fmt.Fprintf(&b, "kubectl annotate crd %s %s=true", strings.Join(c.CRDs, " "), AllowFieldLossAnnotation)
	case CommandArgoSyncOption:
		value, overwrite := c.SyncOption, ""
		if strings.TrimSpace(c.ExistingSyncOptions) != "" {
			value, overwrite = MergeSyncOptions(c.ExistingSyncOptions, c.SyncOption), "--overwrite "
		}
		fmt.Fprintf(&b, "kubectl annotate %scrd %s %s", overwrite, strings.Join(c.CRDs, " "), shellWord(ArgoSyncOptionsAnnotation+"="+value))
	case CommandAllowDelete:
		fmt.Fprintf(&b, "kubectl annotate crd %s %s=true", strings.Join(c.CRDs, " "), AllowDeleteAnnotation)
	case CommandCRDBackup:
		fmt.Fprintf(&b, "upgradeguard crd backup %s --dir %s", strings.Join(c.CRDs, " "), c.Dir)
	case CommandCRDRestore:
		b.WriteString("upgradeguard crd restore --dir " + c.Dir)
	case CommandDeleteObjects:
		fmt.Fprintf(&b, "kubectl delete %s --all --all-namespaces", strings.Join(c.CRDs, ","))
	case CommandPlan:
		b.WriteString("upgradeguard plan")
		for _, f := range [][2]string{{" --release ", c.Release}, {" -n ", c.Namespace}, {" --chart ", c.Chart}, {" --version ", c.ChartVersion}} {
			if f[1] != "" {
				b.WriteString(f[0] + f[1])
			}
		}
	case CommandPlanHelmRelease:
		fmt.Fprintf(&b, "upgradeguard plan --helmrelease %s/%s", c.Namespace, c.Release)
		if c.ChartVersion != "" {
			b.WriteString(" --version " + c.ChartVersion)
		}
	case CommandPlanApplication:
		fmt.Fprintf(&b, "upgradeguard plan --argocd-app %s/%s", c.Namespace, c.Release)
	case CommandHelmUpgrade:
		chart := c.Chart
		if chart == "" {
			chart = "CHART"
		}
		b.WriteString("helm upgrade " + c.Release + " " + chart)
		for _, f := range [][2]string{{" --repo ", c.Repo}, {" --version ", c.ChartVersion}} {
			if f[1] != "" {
				b.WriteString(f[0] + f[1])
			}
		}
		if c.PlainHTTP {
			b.WriteString(" --plain-http")
		}
		for _, f := range c.ValuesFiles {
			b.WriteString(" -f " + f)
		}
		b.WriteString(nsFlag(c.Namespace))
	case CommandCheck:
		fmt.Fprintf(&b, "upgradeguard check --release %s%s --chart %s", c.Release, nsFlag(c.Namespace), c.Chart)
	case CommandCheckApplication:
		fmt.Fprintf(&b, "upgradeguard check --argocd-app %s/%s", c.Namespace, c.Release)
	case CommandCheckApplicationManifests:
		name := c.Release
		if c.Namespace != "" {
			name = c.Namespace + "/" + name
		}
		b.WriteString("argocd app manifests " + name + " | upgradeguard check --manifests -")
	case CommandUninstallBackup:
		fmt.Fprintf(&b, "upgradeguard release uninstall-check %s%s --backup DIR", c.Release, nsFlag(c.Namespace))
	case CommandHelmRollback:
		fmt.Fprintf(&b, "helm rollback %s %d%s", c.Release, c.Revision, nsFlag(c.Namespace))
	case CommandHelmReleaseVersion:
		fmt.Fprintf(&b, `commit spec.chart.spec.version: %q to HelmRelease %s/%s (or: kubectl patch helmrelease %s -n %s --type merge -p '{"spec":{"chart":{"spec":{"version":%q}}}}')`,
			c.ChartVersion, c.Namespace, c.Release, c.Release, c.Namespace, c.ChartVersion)
	case CommandApplicationRevision:
		position := ""
		if c.SourcePosition > 0 {
			position = fmt.Sprintf(" --source-position %d", c.SourcePosition)
		}
		fmt.Fprintf(&b, `commit targetRevision: %q to the Helm source of Application %s/%s (or: argocd app set %s/%s%s --revision %s)`,
			c.ChartVersion, c.Namespace, c.Release, c.Namespace, c.Release, position, c.ChartVersion)
	}
	return b.String()
}

// shellWord quotes s for a POSIX shell when it holds more than letters, digits and
// -_.,=/:
func shellWord(s string) string {
	for _, r := range s {
		plain := r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_.,=/:", r)
		if !plain {
			return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
		}
	}
	return s
}

func nsFlag(ns string) string {
	if ns == "" {
		return ""
	}
	return " -n " + ns
}
