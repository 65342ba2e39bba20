package main

import (
	"archive/tar"
	"bytes"
	"encoding/pem"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"golang.org/x/crypto/x509roots/fallback/bundle"
)

const (
	// ImageRepository is the image's default repository: charts/upgradeguard's
	// image.repository. The tag is Release.Tag(), the chart's appVersion.
	ImageRepository = "ghcr.io/upgradeguard/upgradeguard"
	// SourceURL is the project's source repository (OCI label, krew homepage).
	SourceURL = "https://github.com/upgradeguard/upgradeguard"
	// BinaryPath is where the image holds the binary: its entrypoint.
	BinaryPath = "/usr/local/bin/upgradeguard"
	// CABundlePath is the CA bundle the image carries, at the path Go's crypto/x509
	// reads first on Linux, for HTTPS chart repositories and OCI registries.
	CABundlePath = "/etc/ssl/certs/ca-certificates.crt"
	// NonRootUID is the user and group the image runs as (the distroless "nonroot").
	NonRootUID = 65532
)

// ImageResult says where BuildImage wrote the image.
type ImageResult struct {
	// Ref is the image reference, repository:tag.
	Ref string
	// Digest is the image index digest: the same for two builds of one commit.
	Digest v1.Hash
	// Layout is the OCI image layout directory (crane push --index, skopeo oci:).
	Layout string
	// Archive is the same layout as a tar file (skopeo oci-archive:, kind load
	// image-archive, ctr images import --all-platforms).
	Archive string
	// DockerArchives are single-platform `docker save` tarballs (docker load, kind load
	// image-archive, crane push).
	DockerArchives []string
}

// BuildImage assembles the image index from one binary per platform and writes it under
// dir. No container daemon is involved, and nothing depends on the wall clock.
func BuildImage(r Release, bins map[Platform]string, dir string) (*ImageResult, error) {
	ref, err := name.NewTag(ImageRepository + ":" + r.Tag())
	if err != nil {
		return nil, fmt.Errorf("image reference for version %s: %w", r.Version, err)
	}
	base, err := baseLayer(r.Date)
	if err != nil {
		return nil, err
	}
	plats := sortedPlatforms(bins)
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	images := map[Platform]v1.Image{}
	for _, p := range plats {
		img, err := platformImage(r, p, base, bins[p])
		if err != nil {
			return nil, fmt.Errorf("image for %s: %w", p, err)
		}
		images[p] = img
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{
			Platform: &v1.Platform{OS: p.OS, Architecture: p.Arch},
		}})
	}
	idx = mutate.Annotations(idx, labels(r)).(v1.ImageIndex)
	digest, err := idx.Digest()
	if err != nil {
		return nil, err
	}

	if err := os.RemoveAll(dir); err != nil {
		return nil, err
	}
	res := &ImageResult{Ref: ref.String(), Digest: digest, Layout: filepath.Join(dir, "oci")}
	lp, err := layout.Write(res.Layout, empty.Index)
	if err != nil {
		return nil, fmt.Errorf("write OCI layout: %w", err)
	}
	if err := lp.AppendIndex(idx, layout.WithAnnotations(map[string]string{
		"org.opencontainers.image.ref.name": r.Tag(),
		"io.containerd.image.name":          ref.String(),
	})); err != nil {
		return nil, fmt.Errorf("write OCI layout: %w", err)
	}
	res.Archive = filepath.Join(dir, "upgradeguard-"+r.Tag()+".oci.tar")
	if err := tarDir(res.Layout, res.Archive, r.Date); err != nil {
		return nil, err
	}
	for _, p := range plats {
		path := filepath.Join(dir, fmt.Sprintf("upgradeguard-%s-%s-%s.docker.tar", r.Tag(), p.OS, p.Arch))
		if err := tarball.WriteToFile(path, ref, images[p]); err != nil {
			return nil, fmt.Errorf("write docker archive for %s: %w", p, err)
		}
		res.DockerArchives = append(res.DockerArchives, path)
	}
	return res, nil
}

func labels(r Release) map[string]string {
	return map[string]string{
		"org.opencontainers.image.title":       "upgradeguard",
		"org.opencontainers.image.description": "Makes Helm and Flux upgrades, rollbacks and chart migrations safe across CRD storage-version changes",
		"org.opencontainers.image.source":      SourceURL,
		"org.opencontainers.image.url":         SourceURL,
		"org.opencontainers.image.version":     r.Version,
		"org.opencontainers.image.revision":    r.Commit,
		"org.opencontainers.image.created":     r.Date.Format(time.RFC3339),
	}
}

func platformImage(r Release, p Platform, base v1.Layer, bin string) (v1.Image, error) {
	binData, err := os.ReadFile(bin)
	if err != nil {
		return nil, err
	}
	binLayer, err := layerOf(r.Date, []tarEntry{
		{name: "usr/", dir: true, mode: 0o755},
		{name: "usr/local/", dir: true, mode: 0o755},
		{name: "usr/local/bin/", dir: true, mode: 0o755},
		{name: BinaryPath[1:], data: binData, mode: 0o755},
	})
	if err != nil {
		return nil, err
	}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	cfg, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cfg = cfg.DeepCopy()
	cfg.OS, cfg.Architecture = p.OS, p.Arch
	cfg.Created = v1.Time{Time: r.Date}
	cfg.Config = v1.Config{
		Entrypoint: []string{BinaryPath},
		Cmd:        []string{"controller"},
		User:       fmt.Sprintf("%d:%d", NonRootUID, NonRootUID),
		WorkingDir: "/",
		Env: []string{
			"PATH=/usr/local/bin:/usr/bin:/bin",
			"SSL_CERT_FILE=" + CABundlePath,
			"HOME=/home/nonroot",
		},
		Labels: labels(r),
	}
	if img, err = mutate.ConfigFile(img, cfg); err != nil {
		return nil, err
	}
	created := v1.Time{Time: r.Date}
	return mutate.Append(img,
		mutate.Addendum{Layer: base, History: v1.History{Created: created, CreatedBy: "hack/dist: passwd, group, CA bundle, /tmp", Comment: "base"}},
		mutate.Addendum{Layer: binLayer, History: v1.History{Created: created, CreatedBy: "hack/dist: go build -trimpath (CGO_ENABLED=0) ./cmd/upgradeguard", Comment: r.Version}},
	)
}

// baseLayer is everything but the binary: a nonroot user, the CA bundle and a /tmp.
// The root filesystem can be read-only: the chart mounts a writable /tmp.
func baseLayer(date time.Time) (v1.Layer, error) {
	ca, err := caBundle()
	if err != nil {
		return nil, err
	}
	uid := NonRootUID
	return layerOf(date, []tarEntry{
		{name: "etc/", dir: true, mode: 0o755},
		{name: "etc/passwd", mode: 0o644, data: fmt.Appendf(nil,
			"root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\nnonroot:x:%d:%d:nonroot:/home/nonroot:/sbin/nologin\n", uid, uid)},
		{name: "etc/group", mode: 0o644, data: fmt.Appendf(nil, "root:x:0:\nnobody:x:65534:\nnonroot:x:%d:\n", uid)},
		{name: "etc/nsswitch.conf", mode: 0o644, data: []byte("hosts: files dns\n")},
		{name: "etc/ssl/", dir: true, mode: 0o755},
		{name: "etc/ssl/certs/", dir: true, mode: 0o755},
		{name: CABundlePath[1:], mode: 0o644, data: ca},
		{name: "home/", dir: true, mode: 0o755},
		{name: "home/nonroot/", dir: true, mode: 0o700, uid: uid},
		{name: "tmp/", dir: true, mode: 0o1777},
	})
}

// caBundle renders the Mozilla NSS roots that golang.org/x/crypto/x509roots/fallback
// carries (a pinned Go module: the bundle is the same on every build machine) as PEM.
// Roots with a distrust-after constraint are left out: a PEM file cannot carry the
// constraint, and trusting them without it would be wider than NSS.
func caBundle() ([]byte, error) {
	var buf bytes.Buffer
	n := 0
	for root := range bundle.Roots() {
		if root.Constraint != nil {
			continue
		}
		if err := pem.Encode(&buf, &pem.Block{Type: "CERTIFICATE", Bytes: root.Certificate}); err != nil {
			return nil, err
		}
		n++
	}
	if n < 50 {
		return nil, fmt.Errorf("CA bundle holds only %d roots", n)
	}
	return buf.Bytes(), nil
}

type tarEntry struct {
	name string
	dir  bool
	mode int64
	uid  int
	data []byte
}

// writeTar writes entries sorted by name, owned by uid (root unless set), stamped with
// date: the same entries give the same bytes.
func writeTar(w io.Writer, date time.Time, entries []tarEntry) error {
	sort.Slice(entries, func(i, j int) bool { return entries[i].name < entries[j].name })
	tw := tar.NewWriter(w)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Mode: e.mode, Uid: e.uid, Gid: e.uid, ModTime: date, Format: tar.FormatPAX}
		if e.dir {
			h.Typeflag = tar.TypeDir
		} else {
			h.Typeflag, h.Size = tar.TypeReg, int64(len(e.data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if _, err := tw.Write(e.data); err != nil {
			return err
		}
	}
	return tw.Close()
}

func layerOf(date time.Time, entries []tarEntry) (v1.Layer, error) {
	var buf bytes.Buffer
	if err := writeTar(&buf, date, entries); err != nil {
		return nil, err
	}
	data := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil },
		tarball.WithMediaType(types.OCILayer), tarball.WithCompressedCaching)
}

// tarDir writes the files under dir into a tar file, sorted, stamped with date.
func tarDir(dir, dst string, date time.Time) error {
	var entries []tarEntry
	err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil || path == dir {
			return err
		}
		rel, err := filepath.Rel(dir, path)
		if err != nil {
			return err
		}
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			entries = append(entries, tarEntry{name: rel + "/", dir: true, mode: 0o755})
			return nil
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		entries = append(entries, tarEntry{name: rel, mode: 0o644, data: data})
		return nil
	})
	if err != nil {
		return err
	}
	f, err := os.Create(dst)
	if err != nil {
		return err
	}
	if err := writeTar(f, date, entries); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", dst, err)
	}
	return f.Close()
}

func sortedPlatforms(bins map[Platform]string) []Platform {
	plats := make([]Platform, 0, len(bins))
	for p := range bins {
		plats = append(plats, p)
	}
	sort.Slice(plats, func(i, j int) bool { return plats[i].String() < plats[j].String() })
	return plats
}
