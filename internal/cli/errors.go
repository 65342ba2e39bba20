package cli

import (
	"errors"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/upgradeguard/upgradeguard/pkg/argoapp"
	"github.com/upgradeguard/upgradeguard/pkg/backup"
	"github.com/upgradeguard/upgradeguard/pkg/chartmigrate"
	"github.com/upgradeguard/upgradeguard/pkg/chartsource"
	"github.com/upgradeguard/upgradeguard/pkg/cmdline"
	"github.com/upgradeguard/upgradeguard/pkg/crdbackup"
	"github.com/upgradeguard/upgradeguard/pkg/helmrelease"
	"github.com/upgradeguard/upgradeguard/pkg/migrate"
	"github.com/upgradeguard/upgradeguard/pkg/slots"
)

// The commands whose errors are classified here, by the name a user types.
const (
	cmdCheck          = "check"
	cmdPlan           = "plan"
	cmdApplyCheck     = "release apply-check"
	cmdRollbackCheck  = "release rollback-check"
	cmdMigrate        = "migrate"
	cmdRBAC           = "rbac"
	cmdAudit          = "audit"
	cmdAuditFleet     = "audit --fleet"
	cmdUninstallCheck = "release uninstall-check"
	cmdDiffFailed     = "release diff-failed"
	cmdReleaseMigrate = "release migrate"
	cmdCRDBackup      = "crd backup"
	cmdCRDRestore     = "crd restore"
	cmdCRDAdopt       = "crd adopt"
	cmdAPF            = "apf"
)

// rbacNeeds is, per command, the permissions it needs: the advice for a Forbidden or
// Unauthorized error names that command's verbs, not another's.
var rbacNeeds = map[string]string{
	cmdCheck: "upgradeguard check needs get/list on customresourcedefinitions.apiextensions.k8s.io, list on the custom resources it counts, " +
		"and get/list on the release's Secrets (or ConfigMaps); with --argocd-app, get on applications.argoproj.io and list on Secrets in --argocd-namespace; " +
		"see docs/operator-guide.md#rbac",
	cmdPlan: "upgradeguard plan needs what `" + cmdline.Check{}.String() + "` needs (get/list on customresourcedefinitions, list on the custom resources " +
		"it counts, get/list on the release's Secrets or ConfigMaps), get on the HelmRelease and its source with --helmrelease, and with " +
		"--argocd-app get on applications.argoproj.io and list on Secrets in --argocd-namespace",
	cmdApplyCheck: "apply-check needs get/list on the release's Secrets (or ConfigMaps), get on every object of the release and the chart, " +
		"patch on them (its server-side dry runs are authorized as writes; nothing is written), and what `" + cmdline.Check{}.String() + "` needs",
	cmdRollbackCheck: "rollback-check needs get/list on the release's Secrets (or ConfigMaps), get on every object of both revisions, " +
		"patch on them (its server-side dry runs are authorized as writes; nothing is written), and what `" + cmdline.Check{}.String() + "` needs",
	cmdMigrate: "upgradeguard migrate needs get/list on customresourcedefinitions.apiextensions.k8s.io, update on customresourcedefinitions/status " +
		"(and update on the CRDs themselves for a storage switch), list and patch on the custom resources it migrates, and create/get/update on " +
		"Leases in --lease-namespace; `" + cmdline.RBAC{CRDs: []string{"NAME"}}.String() + "` prints exactly that role (with --engine builtin: create/get/list/watch/delete on " +
		"storageversionmigrations instead of patch on the custom resources, which it only lists to judge field loss; `" +
		cmdline.RBAC{CRDs: []string{"NAME"}, Engine: string(migrate.EngineBuiltin)}.String() + "`)",
	cmdRBAC: "upgradeguard rbac needs get on customresourcedefinitions.apiextensions.k8s.io (with --chart or --rollback also what " +
		"`" + cmdline.Check{}.String() + "` needs: get/list on the release's Secrets or ConfigMaps)",
	cmdAudit: "upgradeguard audit needs list on helmreleases.helm.toolkit.fluxcd.io, on the Helm release Secrets (or ConfigMaps), " +
		"on storagemigrationpolicies.upgradeguard.io, customresourcedefinitions and leases, and on applications.argoproj.io and " +
		"mutatingwebhookconfigurations for Argo CD; see docs/cli.md#audit",
	cmdAuditFleet: cmdline.Audit{Fleet: true}.String() + " needs list on Secrets in the -n namespace of the platform cluster, and on leases, " +
		"storagemigrationpolicies.upgradeguard.io and storagemigrations.upgradeguard.io; on each target what `" + cmdline.Audit{}.String() + "` needs",
	cmdUninstallCheck: "uninstall-check needs get/list on the release's Secrets (or ConfigMaps), get on every object of the release, and list " +
		"on pods, Jobs, PersistentVolumes and, for a Namespace or CRD the release deletes, on what they hold",
	cmdDiffFailed: "diff-failed needs get/list on the release's Secrets (or ConfigMaps), get on every object of both revisions, and patch " +
		"on them (its server-side dry runs are authorized as writes; nothing is written)",
	cmdReleaseMigrate: "release migrate needs what helm uninstall and helm install of the two charts need, plus get/list/patch on " +
		"PersistentVolumes and create/delete on PersistentVolumeClaims and Secrets in the namespace",
	cmdCRDBackup: "crd backup needs get on the customresourcedefinitions.apiextensions.k8s.io it saves and list on their custom resources " +
		"in every namespace",
	cmdCRDAdopt: "crd adopt needs get on the customresourcedefinitions.apiextensions.k8s.io it moves (patch with --apply) and get/list on the " +
		"Helm release Secrets (or ConfigMaps) of both releases",
	cmdAPF: "upgradeguard apf needs create on selfsubjectreviews.authentication.k8s.io (any authenticated user has it) when it takes you as the " +
		"subject, and with --apply create and patch on flowschemas and prioritylevelconfigurations.flowcontrol.apiserver.k8s.io (cluster " +
		"administrators have them; or print the objects and have an administrator apply them)",
	cmdCRDRestore: "crd restore needs get/create on customresourcedefinitions.apiextensions.k8s.io, get on the namespaces the objects live in, " +
		"and get/list/create on the custom resources, update on their status subresource, update with --overwrite, and patch when " +
		"objects of the backup own each other",
}

// classifyAs turns a library error met by command into an exit-2 error that says what to
// do: the library's errors are neutral, and the flag or permission advice is added here.
func classifyAs(command string, err error, conn *connection) error {
	var nf *helmrelease.NotFoundError
	var exists *backup.ExistsError
	var held *migrate.LeaseHeldError
	if a := advice(command, err); a != "" {
		return couldNot("%w%s", err, a)
	}
	if errors.As(err, &nf) || errors.As(err, &exists) || errors.As(err, &held) || backupFault(err) {
		return couldNot("%w", err)
	}
	return couldNot("%w (API server %s)", err, conn.host)
}

// backupFault says whether err is about a backup's files or a name, not the API server.
func backupFault(err error) bool {
	return errors.As(err, new(*backup.KindError)) || errors.As(err, new(*crdbackup.CorruptError)) ||
		errors.As(err, new(*crdbackup.MissingNamespacesError)) || errors.As(err, new(*crdbackup.NotFoundError))
}

// chartFailed is the exit-2 error of a chart that could not be fetched, loaded or
// rendered, with what command's flags can do about it.
func chartFailed(command string, err error) error {
	return couldNot("%w%s", err, advice(command, err))
}

// classifyErr is classifyAs that keeps nil.
func classifyErr(command string, err error, conn *connection) error {
	if err == nil {
		return nil
	}
	return classifyAs(command, err, conn)
}

// advice is what to do about err, in command's flags and verbs: "" when there is nothing
// to add.
func advice(command string, err error) string {
	var (
		sw       *migrate.StorageSwitchError
		confirm  *chartmigrate.ConfirmationError
		mismatch *chartmigrate.RecordMismatchError
		secret   *chartmigrate.MissingSecretError
		nf       *helmrelease.NotFoundError
		load     *chartsource.LoadError
		repoErr  *argoapp.RepositoryError
	)
	switch {
	case errors.As(err, &repoErr) && repoErr.Secret == "":
		return "; if Argo CD keeps its repository Secrets in another namespace, pass --argocd-namespace"
	case repoErr != nil:
		return "" // it names the repository Secret to fix
	case errors.As(err, &load) && load.Remote() && refusedCredentials(load.Err):
		return "; the chart server wants credentials: pass --username and --password (and --ca-file, --cert-file and --key-file for TLS)"
	case errors.As(err, &nf) && nf.Revision == 0 && nf.Driver == helmrelease.DriverSecret:
		return "; pass --helm-driver configmap if it was installed with HELM_DRIVER=configmap"
	case errors.As(err, new(*helmrelease.NotFailedError)):
		return ": pass --revision N to compare a given revision with the one before it"
	case errors.As(err, new(*helmrelease.RevisionError)):
		return " (--revision and --to-revision take a revision from `" + cmdline.HelmHistory{}.String() + "`)"
	case errors.Is(err, slots.ErrTooFewRefs):
		return ": pass --ref at least twice, oldest release line first"
	case migrate.IsMigratingElsewhere(err) && command == cmdMigrate:
		return ": wait for it with --wait"
	case errors.As(err, new(*migrate.BuiltinNotServedError)):
		return ", use --engine client (it needs patch on the custom resources: `" + cmdline.RBAC{CRDs: []string{"NAME"}}.String() + "`)"
	case errors.As(err, new(*migrate.BuiltinNotRunningError)):
		return ": add storage-version-migrator-controller (and garbage-collector-controller) to kube-controller-manager's --controllers " +
			"(on 1.35 and 1.36 also --feature-gates=StorageVersionMigrator=true), or use --engine client"
	case errors.As(err, new(*migrate.CRDNotFoundError)):
		return ": check the name with `" + cmdline.Get{Resource: "crd"}.String() + "`"
	case errors.As(err, &sw):
		return ": confirm with --allow-storage-switch"
	case errors.As(err, &confirm):
		return ": pass --yes to agree"
	case errors.As(err, &mismatch):
		return ": use another --backup-dir"
	case errors.As(err, new(*backup.IncompleteError)) && command == cmdCRDRestore:
		return ": take one with `" + cmdline.CRDBackup{CRDs: []string{"CRD..."}, Dir: "DIR"}.String() + "` while the CRD is still there"
	case errors.As(err, new(*backup.IncompleteError)):
		return ": take one with `" + cmdline.UninstallBackup{Release: "NAME", Namespace: "NS"}.String() + "`"
	case errors.As(err, new(*crdbackup.NotFoundError)):
		return ": check the name with `" + cmdline.Get{Resource: "crd"}.String() + "`"
	case errors.As(err, &secret):
		return ": pass --map-secret OLD=NEW with another name, or restore it first"
	case errors.Is(err, chartmigrate.ErrBlocked):
		return ": fix them, or pass --override-blocking if you have read them and accept them"
	case apierrors.IsForbidden(err) || apierrors.IsUnauthorized(err):
		return "\n" + rbacNeeds[command]
	}
	return ""
}

// refusedCredentials says whether the chart server refused a fetch, or a listing of its
// versions, with 401 or 403. Helm's HTTP getter reports the status only in its message
// ("failed to fetch URL : 401 Unauthorized"); an OCI registry's error names its
// "unauthorized" or "denied" code.
func refusedCredentials(err error) bool {
	msg := err.Error()
	for _, s := range []string{"401 Unauthorized", "403 Forbidden", "unauthorized:", "denied:"} {
		if strings.Contains(msg, s) {
			return true
		}
	}
	return false
}
