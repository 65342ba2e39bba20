package cli

import (
	"bytes"
	"testing"

	"github.com/upgradeguard/upgradeguard/internal/output"
	"github.com/upgradeguard/upgradeguard/pkg/finding"
	"github.com/upgradeguard/upgradeguard/pkg/uninstall"
)

func goldenUninstallReport() *uninstall.Report {
	yes, no := true, false
	return &uninstall.Report{
		Release: "tenant-d", Namespace: "apps", Driver: "secret", Chart: "eks", ChartVersion: "1.0.3",
		Revision: 4, Status: "failed", LastDeployedRevision: 3, NotDeployed: true, LeftBehind: []string{"ConfigMap/apps/old-settings"},
		HelmVersion: "4.2", VerifiesOwnership: false,
		Objects: []uninstall.Object{
			{Subject: "Job/apps/training", APIVersion: "batch/v1", Kind: "Job", Namespace: "apps", Name: "training", Action: uninstall.Absent,
				Reason: "not on the cluster: nothing to delete"},
			{Subject: "PersistentVolumeClaim/apps/mysql", APIVersion: "v1", Kind: "PersistentVolumeClaim", Namespace: "apps", Name: "mysql",
				Action: uninstall.Delete, Live: true, LiveKeep: true, Owned: &yes,
				Reason: "helm.sh/resource-policy: keep is only on the live object, not in the stored manifest: Helm ignores it and deletes the object",
				PVC: &uninstall.PVCInfo{Phase: "Bound", Volume: "pvc-1234", ReclaimPolicy: "Delete", StorageClass: "client-storage", StorageClassDeleted: true,
					UsedBy: []string{"Job/apps/train-9"}}},
			{Subject: "PersistentVolumeClaim/apps/logs", APIVersion: "v1", Kind: "PersistentVolumeClaim", Namespace: "apps", Name: "logs",
				Action: uninstall.Keep, Live: true, Owned: &yes, Reason: "helm.sh/resource-policy: keep is in the stored manifest"},
			{Subject: "StorageClass/client-storage", APIVersion: "storage.k8s.io/v1", Kind: "StorageClass", Name: "client-storage",
				Action: uninstall.Delete, Live: true, Owned: &no,
				Reason:  "listed in the stored manifest; Helm 4.2 does not look at the live ownership metadata (label app.kubernetes.io/managed-by missing)",
				Storage: &uninstall.StorageInfo{PersistentVolumes: []string{"pvc-1234"}}},
			{Subject: "Secret/apps/mysql-secrets", APIVersion: "v1", Kind: "Secret", Namespace: "apps", Name: "mysql-secrets",
				Action: uninstall.Delete, Live: true, Owned: &yes, Reason: "listed in the stored manifest without helm.sh/resource-policy: keep",
				Secret: &uninstall.SecretInfo{Type: "Opaque", Keys: []string{"root-password", "user-password"}}},
			{Subject: "ConfigMap/apps/tuning", APIVersion: "v1", Kind: "ConfigMap", Namespace: "apps", Name: "tuning",
				Action: uninstall.Untouched, Live: true, Owned: &yes, Reason: `helm.sh/resource-policy is "retain" in the stored manifest: Helm neither deletes it nor reports it as kept`},
			{Subject: "Namespace/tenant-d-data", APIVersion: "v1", Kind: "Namespace", Name: "tenant-d-data",
				Action: uninstall.Delete, Live: true, Owned: &yes, Reason: "listed in the stored manifest without helm.sh/resource-policy: keep",
				Cascade: &uninstall.Cascade{Total: 11, Counts: map[string]int{"configmaps": 2, "pods": 9}}},
		},
		Hooks: []string{"Job/cleanup (pre-delete)"},
		Findings: []uninstall.Finding{
			{Check: uninstall.CheckNotDeployed, Subject: "release/apps/tenant-d", Severity: finding.Danger, Message: "the last revision 4 is failed: helm uninstall deletes what ITS stored manifest lists",
				Remediation: "roll back first"},
			{Check: uninstall.CheckLiveOnlyKeep, Subject: "PersistentVolumeClaim/apps/mysql", Severity: finding.Danger, Message: "keep is set on the live object only", Remediation: "Option A"},
			{Check: uninstall.CheckPVDelete, Subject: "PersistentVolumeClaim/apps/mysql", Severity: finding.Danger, Message: "DATA LOSS", Remediation: "patch the PV to Retain"},
		},
	}
}

func TestRenderUninstallCheckGolden(t *testing.T) {
	yes := true
	safe := &uninstall.Report{Release: "web", Namespace: "web", Driver: "configmap", Chart: "web", ChartVersion: "2.0.0", Revision: 2, Status: "deployed",
		LastDeployedRevision: 2, HelmVersion: "4.3", VerifiesOwnership: true, LeftBehind: []string{}, Hooks: []string{}, Findings: []uninstall.Finding{}, Safe: true,
		Objects: []uninstall.Object{
			{Subject: "ConfigMap/web/settings", APIVersion: "v1", Kind: "ConfigMap", Namespace: "web", Name: "settings", Action: uninstall.Delete, Live: true, Owned: &yes,
				Reason: "listed in the stored manifest without helm.sh/resource-policy: keep"},
			{Subject: "PersistentVolumeClaim/web/data", APIVersion: "v1", Kind: "PersistentVolumeClaim", Namespace: "web", Name: "data", Action: uninstall.Keep, Live: true, Owned: &yes,
				Reason: "helm.sh/resource-policy: keep is in the stored manifest"},
		}}
	withBackup := &uninstallCheckOutput{Report: safe, BackupDir: "db-backup", Backup: &uninstall.BackupResult{Release: "web", Namespace: "web", Revision: 2,
		Files: []uninstall.BackupFile{{Subject: "PersistentVolumeClaim/web/data", Kind: "PersistentVolumeClaim", Namespace: "web", Name: "data",
			File: "objects/persistentvolumeclaim-web-data.yaml", Volume: "pv-9"}}}}
	cases := []struct {
		name   string
		format string
		out    *uninstallCheckOutput
	}{
		{"uninstall-check-unsafe.txt", "text", &uninstallCheckOutput{Report: goldenUninstallReport()}},
		{"uninstall-check-unsafe.json", "json", &uninstallCheckOutput{Report: goldenUninstallReport()}},
		{"uninstall-check-safe.txt", "text", &uninstallCheckOutput{Report: safe}},
		{"uninstall-check-backup.txt", "text", withBackup},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			if err := output.Write(&buf, tc.format, tc.out, tc.out.text); err != nil {
				t.Fatal(err)
			}
			checkGolden(t, tc.name, buf.String())
		})
	}
}
