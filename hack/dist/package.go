package main

import (
	"archive/zip"
	"bufio"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"golang.org/x/sync/errgroup"
	"sigs.k8s.io/yaml"
)

// Names of what Package writes under the dist folder.
const (
	ChecksumsFile = "checksums.txt"
	KrewManifest  = "plugins/upgradeguard.yaml"
	HelmPluginDir = "helm-plugin"
)

// ArchiveName is the release archive of p: .zip on Windows, .tar.gz elsewhere.
func ArchiveName(r Release, p Platform) string {
	ext := ".tar.gz"
	if p.OS == "windows" {
		ext = ".zip"
	}
	return fmt.Sprintf("upgradeguard_%s_%s_%s%s", r.Tag(), p.OS, p.Arch, ext)
}

// HelmPluginArchiveName is the Helm plugin archive of p, for `helm plugin install
// FILE|URL`. Helm derives the plugin's directory from a local archive's name (the part
// before "-<version>"), so it starts with the plugin name and a dash.
func HelmPluginArchiveName(r Release, p Platform) string {
	return fmt.Sprintf("upgradeguard-%s-%s-%s.helm-plugin.tgz", r.Tag(), p.OS, p.Arch)
}

// ReleaseURL is where the release's assets are published (krew downloads from here).
func ReleaseURL(r Release, file string) string {
	return SourceURL + "/releases/download/" + r.Version + "/" + file
}

// PackageResult lists the artefacts, relative to the dist folder.
type PackageResult struct {
	Artefacts []string
}

// Package writes, for each platform binary, the release archive (upgradeguard and
// kubectl-upgradeguard, README), a CycloneDX SBOM, and the Helm plugin (a directory
// and an archive); then the krew manifest and the checksums of everything. sbomTool is
// the cyclonedx-gomod binary; empty skips the SBOMs.
func Package(ctx context.Context, r Release, bins map[Platform]string, dir, sbomTool string) (*PackageResult, error) {
	res := &PackageResult{}
	readme, err := os.ReadFile(filepath.Join(r.Root, "README.md"))
	if err != nil {
		return nil, err
	}
	// krew-index requires a licence file in the archive; ship it once the project has one.
	license, err := os.ReadFile(filepath.Join(r.Root, "LICENSE"))
	if err != nil && !os.IsNotExist(err) {
		return nil, err
	}
	// One platform per worker, two at a time: compression is the cost.
	plats := sortedPlatforms(bins)
	sumList := make([]string, len(plats))
	artefacts := make([][]string, len(plats))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(2)
	for i, p := range plats {
		g.Go(func() error {
			var err error
			sumList[i], artefacts[i], err = packagePlatform(gctx, r, p, bins[p], dir, sbomTool, readme, license)
			return err
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	sums := map[Platform]string{}
	for i, p := range plats {
		sums[p] = sumList[i]
		res.Artefacts = append(res.Artefacts, artefacts[i]...)
	}
	manifest, err := KrewPluginManifest(r, sums, license != nil)
	if err != nil {
		return nil, err
	}
	if err := writeFile(filepath.Join(dir, KrewManifest), manifest, 0o644); err != nil {
		return nil, err
	}
	res.Artefacts = append(res.Artefacts, KrewManifest)
	if err := writeChecksums(dir, res.Artefacts); err != nil {
		return nil, err
	}
	res.Artefacts = append(res.Artefacts, ChecksumsFile)
	return res, nil
}

// packagePlatform writes p's release archive, Helm plugin and SBOM, and returns the
// archive's SHA256 and the artefacts written.
func packagePlatform(ctx context.Context, r Release, p Platform, binPath, dir, sbomTool string, readme, license []byte) (string, []string, error) {
	bin, err := os.ReadFile(binPath)
	if err != nil {
		return "", nil, err
	}
	name := ArchiveName(r, p)
	files := []archiveFile{
		{name: p.exe("upgradeguard"), data: bin, mode: 0o755},
		{name: p.exe("kubectl-upgradeguard"), data: bin, mode: 0o755},
		{name: "README.md", data: readme, mode: 0o644},
	}
	if license != nil {
		files = append(files, archiveFile{name: "LICENSE", data: license, mode: 0o644})
	}
	if err := writeArchive(filepath.Join(dir, name), r.Date, files); err != nil {
		return "", nil, err
	}
	sum, err := fileSHA256(filepath.Join(dir, name))
	if err != nil {
		return "", nil, err
	}
	out := []string{name}

	pluginDir, err := WriteHelmPlugin(r, p, binPath, filepath.Join(dir, HelmPluginDir, p.OS+"_"+p.Arch))
	if err != nil {
		return "", nil, err
	}
	pa := HelmPluginArchiveName(r, p)
	if err := writeArchiveDir(pluginDir, filepath.Join(dir, pa), r.Date); err != nil {
		return "", nil, err
	}
	out = append(out, pa)

	if sbomTool != "" {
		sbom := fmt.Sprintf("upgradeguard_%s_%s_%s.cdx.json", r.Tag(), p.OS, p.Arch)
		if err := writeSBOM(ctx, sbomTool, r, binPath, filepath.Join(dir, sbom)); err != nil {
			return "", nil, err
		}
		out = append(out, sbom)
	}
	return sum, out, nil
}

// writeSBOM runs cyclonedx-gomod over the binary: the modules Go linked into it, read
// from its build information. Serial and timestamp are left out, so the SBOM is
// reproducible too.
func writeSBOM(ctx context.Context, tool string, r Release, bin, dst string) error {
	cmd := exec.CommandContext(ctx, tool, "bin", "-json", "-noserial", "-notimestamp", "-version", r.Version, "-output", dst, bin)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("SBOM of %s (%s; `make dist` builds it from hack/tools/cyclonedx-gomod): %w\n%s", bin, tool, err, out)
	}
	return nil
}

type archiveFile struct {
	name string
	data []byte
	mode int64
}

// writeArchive writes a .tar.gz or a .zip with files in name order, stamped with date.
func writeArchive(dst string, date time.Time, files []archiveFile) error {
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	sort.Slice(files, func(i, j int) bool { return files[i].name < files[j].name })
	f, err := os.Create(dst)
	if err != nil {
		return err
	}
	bw := bufio.NewWriterSize(f, 1<<20)
	if strings.HasSuffix(dst, ".zip") {
		zw := zip.NewWriter(bw)
		for _, file := range files {
			h := &zip.FileHeader{Name: file.name, Method: zip.Deflate, Modified: date}
			h.SetMode(os.FileMode(file.mode))
			w, err := zw.CreateHeader(h)
			if err == nil {
				_, err = w.Write(file.data)
			}
			if err != nil {
				f.Close()
				return fmt.Errorf("write %s: %w", dst, err)
			}
		}
		err = zw.Close()
	} else {
		gz := gzip.NewWriter(bw)
		entries := make([]tarEntry, 0, len(files))
		for _, file := range files {
			entries = append(entries, tarEntry{name: file.name, mode: file.mode, data: file.data})
		}
		if err = writeTar(gz, date, entries); err == nil {
			err = gz.Close()
		}
	}
	if err == nil {
		err = bw.Flush()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write %s: %w", dst, err)
	}
	return nil
}

// writeArchiveDir archives a directory as <base name>/... (the layout `helm plugin
// install` expects of a plugin archive).
func writeArchiveDir(dir, dst string, date time.Time) error {
	var files []archiveFile
	base := filepath.Base(dir)
	err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, path)
		if err != nil {
			return err
		}
		files = append(files, archiveFile{name: base + "/" + filepath.ToSlash(rel), data: data, mode: int64(info.Mode().Perm())})
		return nil
	})
	if err != nil {
		return err
	}
	return writeArchive(dst, date, files)
}

func fileSHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// writeChecksums writes `sha256sum -c`-compatible lines for the artefacts, by name.
func writeChecksums(dir string, artefacts []string) error {
	names := append([]string(nil), artefacts...)
	sort.Strings(names)
	var b strings.Builder
	for _, n := range names {
		sum, err := fileSHA256(filepath.Join(dir, n))
		if err != nil {
			return err
		}
		fmt.Fprintf(&b, "%s  %s\n", sum, n)
	}
	return writeFile(filepath.Join(dir, ChecksumsFile), []byte(b.String()), 0o644)
}

func writeFile(path string, data []byte, mode os.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, data, mode)
}

// Krew manifest types: the subset of krew's index.Plugin (apiVersion
// krew.googlecontainertools.github.com/v1alpha2) this plugin uses. `make dist` validates
// the result with krew's own validate-krew-manifest, and the tests install it with krew.
type krewPlugin struct {
	APIVersion string       `json:"apiVersion"`
	Kind       string       `json:"kind"`
	Metadata   krewMetadata `json:"metadata"`
	Spec       krewSpec     `json:"spec"`
}

type krewMetadata struct {
	Name string `json:"name"`
}

type krewSpec struct {
	Version          string         `json:"version"`
	Homepage         string         `json:"homepage"`
	ShortDescription string         `json:"shortDescription"`
	Description      string         `json:"description"`
	Caveats          string         `json:"caveats,omitempty"`
	Platforms        []krewPlatform `json:"platforms"`
}

type krewPlatform struct {
	Selector krewSelector `json:"selector"`
	URI      string       `json:"uri"`
	SHA256   string       `json:"sha256"`
	Files    []krewFile   `json:"files"`
	Bin      string       `json:"bin"`
}

type krewSelector struct {
	MatchLabels map[string]string `json:"matchLabels"`
}

type krewFile struct {
	From string `json:"from"`
	To   string `json:"to"`
}

// KrewPluginManifest is the krew-index manifest (plugins/upgradeguard.yaml) for the
// archives whose SHA256 sums are given per platform.
func KrewPluginManifest(r Release, sums map[Platform]string, withLicense bool) ([]byte, error) {
	m := krewPlugin{
		APIVersion: "krew.googlecontainertools.github.com/v1alpha2",
		Kind:       "Plugin",
		Metadata:   krewMetadata{Name: "upgradeguard"},
		Spec: krewSpec{
			Version:          r.Version,
			Homepage:         SourceURL,
			ShortDescription: "Make Helm and Flux upgrades safe across CRD storage versions",
			Description: `Predicts what a Helm or Flux upgrade, rollback or uninstall will do to a
cluster before it runs: upgrades and rollbacks that the API server will reject
because a CRD drops a version still listed in status.storedVersions, server-side
apply conflicts that leave a half-applied release, and uninstalls that lose data.
It migrates stored objects and prunes storedVersions so the upgrade succeeds.`,
			Caveats: `upgradeguard reads CRDs, custom resources and Helm release Secrets.
'kubectl upgradeguard migrate' rewrites custom resources and patches CRD status;
'kubectl upgradeguard rbac' prints the least-privilege role it needs.`,
		},
	}
	for _, p := range sortedPlatforms(sums) {
		bin := p.exe("kubectl-upgradeguard")
		files := []krewFile{{From: bin, To: "."}, {From: "README.md", To: "."}}
		if withLicense {
			files = append(files, krewFile{From: "LICENSE", To: "."})
		}
		m.Spec.Platforms = append(m.Spec.Platforms, krewPlatform{
			Selector: krewSelector{MatchLabels: map[string]string{"os": p.OS, "arch": p.Arch}},
			URI:      ReleaseURL(r, ArchiveName(r, p)),
			SHA256:   sums[p],
			Files:    files,
			Bin:      bin,
		})
	}
	return yaml.Marshal(m)
}

// WriteHelmPlugin writes the Helm 4 plugin for p into dir/upgradeguard: plugin.yaml
// (apiVersion v1, type cli/v1, subprocess runtime) and the binary, which it runs.
// Helm passes its global flags to the plugin as HELM_* variables, and the binary reads
// them when HELM_PLUGIN_NAME says it runs as this plugin.
func WriteHelmPlugin(r Release, p Platform, bin, dir string) (string, error) {
	root := filepath.Join(dir, "upgradeguard")
	if err := os.RemoveAll(root); err != nil {
		return "", err
	}
	data, err := os.ReadFile(bin)
	if err != nil {
		return "", err
	}
	if err := writeFile(filepath.Join(root, p.exe("upgradeguard")), data, 0o755); err != nil {
		return "", err
	}
	manifest, err := HelmPluginManifest(r, p)
	if err != nil {
		return "", err
	}
	return root, writeFile(filepath.Join(root, "plugin.yaml"), manifest, 0o644)
}

// HelmPluginManifest is plugin.yaml in Helm 4's v1 format (helm.sh/helm/v4
// internal/plugin MetadataV1, with schema.ConfigCLIV1 and the subprocess runtime).
func HelmPluginManifest(r Release, p Platform) ([]byte, error) {
	m := map[string]any{
		"apiVersion": "v1",
		"name":       "upgradeguard",
		"type":       "cli/v1",
		"runtime":    "subprocess",
		"version":    strings.TrimPrefix(r.Version, "v"),
		"sourceURL":  SourceURL,
		"config": map[string]any{
			"usage":     "upgradeguard [command]",
			"shortHelp": "Predict whether an upgrade, rollback or uninstall of a release is safe",
			"longHelp": `Runs upgradeguard with the cluster, namespace and release storage Helm uses:
  helm upgradeguard check RELEASE --chart REF        CRD storage versions of an upgrade
  helm upgradeguard check --rollback --release NAME  the same for a rollback
  helm upgradeguard apply-check RELEASE --chart REF  server-side apply conflicts
  helm upgradeguard uninstall-check RELEASE          what helm uninstall deletes
Helm's -n, --kube-context and --kubeconfig apply, and so do HELM_NAMESPACE,
HELM_KUBECONTEXT, KUBECONFIG, HELM_DRIVER and Helm's repository config and cache.`,
			"ignoreFlags": false,
		},
		"runtimeConfig": map[string]any{
			"platformCommand": []map[string]any{{
				"os": p.OS, "arch": p.Arch,
				"command": "${HELM_PLUGIN_DIR}/" + p.exe("upgradeguard"),
			}},
		},
	}
	return yaml.Marshal(m)
}
