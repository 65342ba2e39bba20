package main

import (
	"archive/tar"
	"crypto/x509"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"helm.sh/helm/v4/pkg/action"
	"helm.sh/helm/v4/pkg/chart/common"
	"helm.sh/helm/v4/pkg/chart/loader"
	release "helm.sh/helm/v4/pkg/release/v1"
	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"

	"github.com/upgradeguard/upgradeguard/pkg/manifest"
)

// binaries builds the image platforms once per test binary into a shared directory, the
// way `make image` does.
var binaries = struct {
	once sync.Once
	rel  Release
	bins map[Platform]string
	err  error
}{}

func testRelease(t *testing.T) Release {
	t.Helper()
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	rel, err := currentRelease(t.Context(), root, "")
	if err != nil {
		t.Fatal(err)
	}
	return rel
}

func imageBinaries(t *testing.T) (Release, map[Platform]string) {
	t.Helper()
	if testing.Short() {
		t.Skip("builds the linux/amd64 and linux/arm64 binaries")
	}
	binaries.once.Do(func() {
		binaries.rel = testRelease(t)
		binaries.bins, binaries.err = buildBinaries(t.Context(), binaries.rel, ImagePlatforms, filepath.Join(sharedDir, "bin"))
	})
	if binaries.err != nil {
		t.Fatal(binaries.err)
	}
	return binaries.rel, binaries.bins
}

// TestImage builds the image as `make image` does, twice from the same binaries, and
// checks what a registry and a container runtime would read: the index platforms, each
// config, the file system, and the linux/amd64 binary running from it.
func TestImage(t *testing.T) {
	rel, bins := imageBinaries(t)
	res, err := BuildImage(rel, bins, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}

	// Reproducible: assembled again from the same binaries, in another directory, the
	// image has the same digest. Each platform is cross-compiled once per test binary
	// (imageBinaries): a second cross-compile would double this package's cold time and,
	// from a warm build cache, only re-link. That the binaries themselves are the same
	// bytes on every build rests on -trimpath, CGO_ENABLED=0 and -buildvcs=false
	// (BuildBinary); docs/development.md#releasing says how it was checked.
	res2, err := BuildImage(rel, bins, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if res.Digest != res2.Digest {
		t.Errorf("two images of %s from the same binaries have digests %s and %s", rel.Commit, res.Digest, res2.Digest)
	}
	if res.Ref != ImageRepository+":"+rel.Tag() {
		t.Errorf("ref %s, want %s:%s", res.Ref, ImageRepository, rel.Tag())
	}

	// The layout on disk, read back as a registry client would.
	ii, err := layout.ImageIndexFromPath(res.Layout)
	if err != nil {
		t.Fatal(err)
	}
	top, err := ii.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(top.Manifests) != 1 || top.Manifests[0].Digest != res.Digest ||
		top.Manifests[0].Annotations["org.opencontainers.image.ref.name"] != rel.Tag() {
		t.Fatalf("index.json: %+v, want one index %s tagged %s", top.Manifests, res.Digest, rel.Tag())
	}
	idx, err := ii.ImageIndex(res.Digest)
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	var plats []string
	images := map[string]v1.Image{}
	for _, d := range im.Manifests {
		plats = append(plats, d.Platform.String())
		if images[d.Platform.String()], err = idx.Image(d.Digest); err != nil {
			t.Fatal(err)
		}
	}
	if diff := cmp.Diff([]string{"linux/amd64", "linux/arm64"}, plats); diff != "" {
		t.Errorf("index platforms (-want +got):\n%s", diff)
	}
	for plat, img := range images {
		cf, err := img.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		if got := cf.OS + "/" + cf.Architecture; got != plat {
			t.Errorf("%s: config platform %s", plat, got)
		}
		c := cf.Config
		if !slices.Equal(c.Entrypoint, []string{BinaryPath}) || c.User != "65532:65532" || !cf.Created.Equal(rel.Date) {
			t.Errorf("%s: entrypoint %v user %q created %v, want [%s] 65532:65532 %v", plat, c.Entrypoint, c.User, cf.Created, BinaryPath, rel.Date)
		}
		for k, want := range map[string]string{
			"org.opencontainers.image.source":   SourceURL,
			"org.opencontainers.image.version":  rel.Version,
			"org.opencontainers.image.revision": rel.Commit,
		} {
			if c.Labels[k] != want {
				t.Errorf("%s: label %s = %q, want %q", plat, k, c.Labels[k], want)
			}
		}
		if !slices.Contains(c.Env, "SSL_CERT_FILE="+CABundlePath) {
			t.Errorf("%s: env %v lacks SSL_CERT_FILE", plat, c.Env)
		}
	}

	// The file system of linux/amd64, flattened as a runtime unpacks it.
	files := unpack(t, images["linux/amd64"])
	bin := files[BinaryPath[1:]]
	if bin.hdr == nil || bin.hdr.Mode&0o111 == 0 || bin.hdr.Uid != 0 {
		t.Fatalf("%s: %+v, want an executable owned by root", BinaryPath, bin.hdr)
	}
	if !strings.Contains(string(files["etc/passwd"].data), "nonroot:x:65532:65532:") {
		t.Errorf("/etc/passwd lacks the nonroot user:\n%s", files["etc/passwd"].data)
	}
	if h := files["tmp"].hdr; h == nil || h.Mode != 0o1777 {
		t.Errorf("/tmp: %+v, want mode 1777", h)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(files[CABundlePath[1:]].data) || len(files[CABundlePath[1:]].data) < 100_000 {
		t.Errorf("%s is not a CA bundle (%d bytes)", CABundlePath, len(files[CABundlePath[1:]].data))
	}
	for name, f := range files {
		if !f.hdr.ModTime.Equal(rel.Date) {
			t.Errorf("%s: mtime %v, want the commit time %v", name, f.hdr.ModTime, rel.Date)
		}
	}

	// The binary from the image runs.
	exe := filepath.Join(t.TempDir(), "upgradeguard")
	if err := os.WriteFile(exe, bin.data, 0o755); err != nil {
		t.Fatal(err)
	}
	out, err := exec.CommandContext(t.Context(), exe, "version", "-o", "json").Output()
	if err != nil {
		t.Fatalf("version: %v", err)
	}
	var v struct{ Version, Commit, BuildDate, Platform string }
	if err := json.Unmarshal(out, &v); err != nil {
		t.Fatalf("version -o json: %v\n%s", err, out)
	}
	if v.Version != rel.Version || v.Commit != rel.Commit || v.BuildDate != rel.Date.Format("2006-01-02T15:04:05Z07:00") || v.Platform != "linux/amd64" {
		t.Errorf("version -o json = %+v, want %s %s %v linux/amd64", v, rel.Version, rel.Commit, rel.Date)
	}
	out, err = exec.CommandContext(t.Context(), exe, "controller", "--help").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--leader-elect") {
		t.Errorf("controller --help: %v\n%s", err, out)
	}

	// The single-platform docker archive holds the same image.
	img, err := tarball.ImageFromPath(res.DockerArchives[0], nil)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := images["linux/amd64"].ConfigName()
	if got, err := img.ConfigName(); err != nil || got != want {
		t.Errorf("%s: config %s (%v), want %s", res.DockerArchives[0], got, err, want)
	}
}

type unpacked struct {
	hdr  *tar.Header
	data []byte
}

func unpack(t *testing.T, img v1.Image) map[string]unpacked {
	t.Helper()
	rc := mutate.Extract(img)
	defer rc.Close()
	out := map[string]unpacked{}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		out[strings.TrimSuffix(h.Name, "/")] = unpacked{h, data}
	}
}

// TestChartDefaultImage: the chart deploys, by default, the image `make image` tags for
// the chart's appVersion.
func TestChartDefaultImage(t *testing.T) {
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	var chart struct {
		AppVersion string `json:"appVersion"`
	}
	var values struct {
		Image struct{ Repository, Tag, Digest string } `json:"image"`
	}
	for file, v := range map[string]any{"Chart.yaml": &chart, "values.yaml": &values} {
		data, err := os.ReadFile(filepath.Join(root, "charts/upgradeguard", file))
		if err != nil {
			t.Fatal(err)
		}
		if err := yaml.Unmarshal(data, v); err != nil {
			t.Fatal(err)
		}
	}
	rel := Release{Version: "v" + chart.AppVersion}
	if !semverRE.MatchString(rel.Version) {
		t.Fatalf("appVersion %q is not a version make image can build", chart.AppVersion)
	}
	if values.Image.Repository != ImageRepository || values.Image.Tag != "" || values.Image.Digest != "" {
		t.Errorf("chart image %+v, want repository %s and the tag from appVersion", values.Image, ImageRepository)
	}
	if rel.Tag() != chart.AppVersion {
		t.Errorf("make image tags version %s as %s, the chart deploys tag %s", rel.Version, rel.Tag(), chart.AppVersion)
	}
	// What the chart deploys is its image template's output: render it with the Helm SDK.
	want := ImageRepository + ":" + rel.Tag()
	d := renderedDeployment(t, filepath.Join(root, "charts/upgradeguard"))
	for _, c := range d.Spec.Template.Spec.Containers {
		if c.Image != want || !slices.Contains(c.Args, "--job-image="+want) {
			t.Errorf("rendered Deployment %s, container %s: image %q, args %q; want image %s, also for --job-image", d.Name, c.Name, c.Image, c.Args, want)
		}
	}
	if len(d.Spec.Template.Spec.Containers) == 0 {
		t.Errorf("rendered Deployment %s has no container", d.Name)
	}
}

// renderedDeployment renders the chart at dir with its default values, as `helm install`
// would (a client-side dry run of the Helm SDK), and returns its one Deployment.
func renderedDeployment(t *testing.T, dir string) *appsv1.Deployment {
	t.Helper()
	ch, err := loader.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	install := action.NewInstall(action.NewConfiguration())
	install.DryRunStrategy = action.DryRunClient
	install.ReleaseName, install.Namespace = "upgradeguard", "upgradeguard-system"
	// The SDK's default (1.20) is below the chart's kubeVersion; the image does not
	// depend on the minor.
	if install.KubeVersion, err = common.ParseKubeVersion("v1.37.0"); err != nil {
		t.Fatal(err)
	}
	r, err := install.RunWithContext(t.Context(), ch, map[string]any{})
	if err != nil {
		t.Fatalf("render %s: %v", dir, err)
	}
	rel, ok := r.(*release.Release)
	if !ok {
		t.Fatalf("render %s: release type %T", dir, r)
	}
	objs, err := manifest.All(rel.Manifest)
	if err != nil {
		t.Fatalf("rendered manifest: %v", err)
	}
	var found []*appsv1.Deployment
	for _, o := range objs {
		if o.GetKind() != "Deployment" {
			continue
		}
		var d appsv1.Deployment
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &d); err != nil {
			t.Fatalf("rendered %s: %v", manifest.Subject(o), err)
		}
		found = append(found, &d)
	}
	if len(found) != 1 {
		t.Fatalf("the chart renders %d Deployments, want 1", len(found))
	}
	return found[0]
}
