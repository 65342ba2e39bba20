package cli

import (
	"bytes"
	"flag"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/upgradeguard/upgradeguard/internal/output"
	"github.com/upgradeguard/upgradeguard/pkg/check"
	"github.com/upgradeguard/upgradeguard/pkg/crdschema"
	"github.com/upgradeguard/upgradeguard/pkg/crdversions"
	"github.com/upgradeguard/upgradeguard/pkg/predict"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

// checkGolden compares got with testdata/name; -update rewrites the file.
func checkGolden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./internal/cli -run %s -update)", err, strings.Split(t.Name(), "/")[0])
	}
	if diff := cmp.Diff(string(want), got); diff != "" {
		t.Errorf("%s (-want +got):\n%s", name, diff)
	}
}

func goldenReport() *check.Report {
	six, zero := int64(6), int64(0)
	v1 := []crdversions.Version{{Name: "v1", Served: true, Storage: true}}
	return &check.Report{
		Operation: predict.Upgrade, Release: "flux", Namespace: "flux-system", Chart: "flux2", ChartVersion: "2.18.2", FromRevision: 2,
		CRDs: []check.CRDReport{
			{Decision: predict.Decision{Name: "helmrepositories.source.toolkit.fluxcd.io", Verdict: predict.Migrate, Source: predict.Templates,
				Reason:             "stored v1beta2 dropped by the incoming CRD: migrate objects to v1 and prune storedVersions first",
				LiveStoredVersions: []string{"v1beta2", "v1"}, LiveStorageVersion: "v1", IncomingVersions: v1, IncomingStorageVersion: "v1",
				MissingStoredVersions: []string{"v1beta2"}, Conversion: "None"},
				Objects: &six, Action: "upgradeguard migrate --crd helmrepositories.source.toolkit.fluxcd.io"},
			{Decision: predict.Decision{Name: "certificates.cert-manager.io", Verdict: predict.Migrate, Source: predict.Templates,
				Reason:             "stored v1alpha2 dropped by the incoming CRD: migrate objects to v1 and prune storedVersions first",
				LiveStoredVersions: []string{"v1alpha2", "v1"}, LiveStorageVersion: "v1", IncomingVersions: v1, IncomingStorageVersion: "v1",
				MissingStoredVersions: []string{"v1alpha2"}, Conversion: "Webhook"},
				ObjectsError: "conversion webhook for cert-manager.io/v1alpha2 failed", Action: "upgradeguard migrate --crd certificates.cert-manager.io"},
			{Decision: predict.Decision{Name: "gitrepositories.source.toolkit.fluxcd.io", Verdict: predict.OK, Source: predict.Templates,
				Reason: "every stored version stays in spec.versions", LiveStoredVersions: []string{"v1"}, LiveStorageVersion: "v1",
				IncomingVersions: v1, IncomingStorageVersion: "v1", MissingStoredVersions: []string{}, Conversion: "None"}, Objects: &zero},
		},
		NextSteps: []string{"upgradeguard migrate --crd helmrepositories.source.toolkit.fluxcd.io --crd certificates.cert-manager.io"},
	}
}

func TestRenderGolden(t *testing.T) {
	safe := &check.Report{Operation: predict.Rollback, Safe: true, Release: "xp", Namespace: "crossplane-system", FromRevision: 2, ToRevision: 1,
		Chart: "crossplane", ChartVersion: "1.17.3", CRDs: goldenReport().CRDs[2:], NextSteps: []string{}}
	manifests := goldenReport()
	manifests.Release, manifests.Namespace, manifests.Chart, manifests.ChartVersion = "", "", "", ""
	for i := range manifests.CRDs {
		n := 2 * i
		manifests.CRDs[i].ManifestObjects = &n
	}
	manifests.Manifests = &check.ManifestSummary{Files: []string{"-"}, Documents: 9, CRDs: len(manifests.CRDs), Objects: 6,
		LiveCRDObjects: []check.CustomResourceCount{{CRD: "helmreleases.helm.toolkit.fluxcd.io", Kind: "HelmRelease", Objects: 3}}}
	noCRDs := &check.Report{Operation: predict.Upgrade, Safe: true, CRDs: []check.CRDReport{}, NextSteps: []string{},
		Manifests: &check.ManifestSummary{Files: []string{"out/a.yaml", "out/b.json"}, Documents: 2, Objects: 2}}
	// A reader that may not make the dry run: the webhooks not asked, the CRD's own
	// validation evaluated here by the server's own minor's rules; and by another minor's,
	// refusing one CRD.
	forbidden := "customresourcedefinitions.apiextensions.k8s.io is forbidden: User \"ci\" cannot update resource \"customresourcedefinitions\""
	sameMinor := crdschema.Local{Minor: 37, ServerMinor: 37}
	notAllAsked := &check.Report{Operation: predict.Upgrade, Safe: true, Release: "flux", Namespace: "flux-system", CRDs: goldenReport().CRDs[2:],
		NextSteps: []string{}, Unasked: []check.Unasked{{What: check.UnaskedDryRun, CRDs: []string{"gitrepositories.source.toolkit.fluxcd.io"}, Why: forbidden, Local: &sameMinor}}}
	otherMinor := crdschema.Local{Minor: 37, ServerMinor: 38}
	refusedHere := &crdschema.Refusal{Causes: []string{"spec.validation.openAPIV3Schema.properties[spec].x-kubernetes-validations[0].rule: Forbidden: estimated rule cost exceeds budget by factor of more than 100x (try simplifying the rule, or adding maxItems, maxProperties, and maxLength where arrays, maps, and strings are declared)"}, Local: &otherMinor}
	localRefused := &check.Report{Operation: predict.Upgrade, Release: "costs", Namespace: "default", NextSteps: []string{},
		CRDs: []check.CRDReport{{Decision: predict.WithRefusal(predict.Decision{Name: "costs.cost.example.com", Verdict: predict.OK, Source: predict.Templates,
			LiveStoredVersions: []string{"v1"}, LiveStorageVersion: "v1", IncomingVersions: goldenReport().CRDs[2].IncomingVersions, IncomingStorageVersion: "v1",
			MissingStoredVersions: []string{}, Conversion: "None"}, refusedHere.Message()), Refusal: refusedHere, AdmissionError: forbidden}},
		Unasked: []check.Unasked{{What: check.UnaskedDryRun, CRDs: []string{"costs.cost.example.com"}, Why: forbidden, Local: &otherMinor},
			{What: check.UnaskedValidation, CRDs: []string{"costs.cost.example.com"}, Why: otherMinor.String(), Local: &otherMinor}}}
	cases := []struct {
		name    string
		format  string
		verbose bool
		rep     *check.Report
	}{
		{"upgrade-blocked.txt", "text", false, goldenReport()},
		{"upgrade-blocked-verbose.txt", "text", true, goldenReport()},
		{"upgrade-blocked.json", "json", false, goldenReport()},
		{"rollback-safe.txt", "text", false, safe},
		{"manifests-blocked.txt", "text", false, manifests},
		{"manifests-blocked.json", "json", false, manifests},
		{"manifests-no-crds.txt", "text", false, noCRDs},
		{"not-all-asked.txt", "text", false, notAllAsked},
		{"refused-here.txt", "text", false, localRefused},
		{"refused-here.json", "json", false, localRefused},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			if err := output.Write(&buf, tc.format, tc.rep, func(w io.Writer) error { return renderText(w, tc.verbose, tc.rep) }); err != nil {
				t.Fatal(err)
			}
			checkGolden(t, tc.name, buf.String())
		})
	}
}
