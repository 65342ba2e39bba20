package predict

import (
	"strings"

	"github.com/upgradeguard/upgradeguard/pkg/cmdline"
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
	// storedVersions (cmdline.Migrate). It is the only fix a tool may carry out unattended.
	FixMigrate Fix = "migrate"
	// FixKeep annotates the live CRD so that the deployer leaves it and its objects
	// (Deployer.KeepCommands: helm.sh/resource-policy=keep for Helm, Keep; the
	// Prune=false sync option for Argo CD, ArgoSyncOption).
	FixKeep Fix = "keep"
	// FixStorageSwitch switches the live storage version to Decision.StorageSwitchTo (served
	// by both sides), then migrates and prunes (cmdline.StorageSwitch, or
	// cmdline.ReverseMigration before a rollback).
	FixStorageSwitch Fix = "storage-switch"
	// FixSteppingStone goes through a chart version whose CRD keeps the live storage
	// version and stores at one the incoming CRD serves, migrating before and after it.
	// A rollback cannot take it: its target is a fixed revision.
	FixSteppingStone Fix = "stepping-stone"
	// FixSchema changes the incoming schema so that it keeps what stored objects hold, or
	// accepts the loss (AllowFieldLoss). No migration helps.
	FixSchema Fix = "schema"
	// FixChart moves to a chart whose CRDs the target API server accepts (or upgrades the
	// control plane to a minor that accepts them first). No migration helps.
	FixChart Fix = "chart"
	// FixPolicy gets past an admission policy that denies the write: the policy's own way
	// (an exception its authors document, the parameter its binding gives it), or a chart
	// whose CRD the policy admits (admissionpolicy.WayOn names which). No migration, and no
	// other Kubernetes minor, helps.
	FixPolicy Fix = "policy"
)

// FixFor returns what fixes a finding.
func FixFor(f Decision) Fix {
	switch f.Verdict {
	case Migrate:
		return FixMigrate
	case Delete, Prune:
		return FixKeep
	case DataLoss:
		return FixSchema
	case Refused:
		return FixChart
	case Move:
		return FixMove
	case PolicyDenied:
		return FixPolicy
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

// The annotations a person is told to set, as commands: each is `kubectl annotate crd A B
// KEY=VALUE` (package cmdline words it), the key and value decided here.

// Keep is `kubectl annotate crd A B helm.sh/resource-policy=keep`: Helm's upgrade or
// rollback leaves a CRD that carries it (FixKeep).
func Keep(crds []string) cmdline.Annotate {
	return cmdline.Annotate{Resource: "crd", Names: crds, Key: KeepAnnotation, Value: KeepValue}
}

// KeepObject is Keep for any object (Kind/name in namespace): `kubectl annotate KIND/NAME
// -n NS helm.sh/resource-policy=keep`.
func KeepObject(kind, name, namespace string) cmdline.Annotate {
	return cmdline.Annotate{Names: []string{kind + "/" + name}, Namespace: namespace, Key: KeepAnnotation, Value: KeepValue}
}

// AllowFieldLoss is `kubectl annotate crd A upgradeguard.io/allow-field-loss=true`: the
// loss of the fields the incoming schema prunes is accepted (FixSchema).
func AllowFieldLoss(crds []string) cmdline.Annotate {
	return cmdline.Annotate{Resource: "crd", Names: crds, Key: AllowFieldLossAnnotation, Value: "true"}
}

// AllowDelete is `kubectl annotate crd A upgradeguard.io/allow-delete=true`: the deletion
// of the CRD and its objects is accepted.
func AllowDelete(crds []string) cmdline.Annotate {
	return cmdline.Annotate{Resource: "crd", Names: crds, Key: AllowDeleteAnnotation, Value: "true"}
}

// ArgoSyncOption adds option (Prune=false, Delete=false) to the CRDs' Argo CD
// sync-options annotation: `kubectl annotate crd A B
// argocd.argoproj.io/sync-options=Prune=false`, which refuses to replace a value already
// there; with existing (the one CRD's value today), `kubectl annotate --overwrite crd A
// argocd.argoproj.io/sync-options=ServerSideApply=true,Prune=false`, the existing options
// kept (MergeSyncOptions).
func ArgoSyncOption(crds []string, option, existing string) cmdline.Annotate {
	c := cmdline.Annotate{Resource: "crd", Names: crds, Key: ArgoSyncOptionsAnnotation, Value: option}
	if strings.TrimSpace(existing) != "" {
		c.Value, c.Overwrite = MergeSyncOptions(existing, option), true
	}
	return c
}
