package main

import (
	"archive/tar"
	"archive/zip"
	"bufio"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"sigs.k8s.io/yaml"
)

// verifyDist checks a dist folder: every line of checksums.txt matches its file, and
// the krew manifest covers exactly the platforms (all of ReleasePlatforms for `make
// dist`) with the checksum of an archive that holds its bin.
func verifyDist(dir string, plats []Platform) error {
	if err := verifyChecksums(dir); err != nil {
		return err
	}
	if err := VerifyKrewManifest(dir, plats); err != nil {
		return err
	}
	fmt.Printf("dist: %s verified: checksums, krew manifest (%d platforms)\n", dir, len(plats))
	return nil
}

func verifyChecksums(dir string) error {
	f, err := os.Open(filepath.Join(dir, ChecksumsFile))
	if err != nil {
		return fmt.Errorf("%w (run make dist)", err)
	}
	defer f.Close()
	var errs []error
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		sum, name, ok := strings.Cut(sc.Text(), "  ")
		if !ok {
			return fmt.Errorf("%s: malformed line %q", ChecksumsFile, sc.Text())
		}
		got, err := fileSHA256(filepath.Join(dir, name))
		if err != nil {
			errs = append(errs, err)
		} else if got != sum {
			errs = append(errs, fmt.Errorf("%s: sha256 %s, checksums.txt says %s", name, got, sum))
		}
	}
	return errors.Join(append(errs, sc.Err())...)
}

// VerifyKrewManifest checks dir's krew manifest against the archives beside it: each
// platform's sha256 is that of the archive its uri names, the archive holds the bin and
// every file the manifest copies, and the platforms are exactly want.
func VerifyKrewManifest(dir string, want []Platform) error {
	data, err := os.ReadFile(filepath.Join(dir, KrewManifest))
	if err != nil {
		return err
	}
	var m krewPlugin
	if err := yaml.UnmarshalStrict(data, &m); err != nil {
		return fmt.Errorf("%s: %w", KrewManifest, err)
	}
	if m.Metadata.Name != "upgradeguard" || m.Kind != "Plugin" || !semverRE.MatchString(m.Spec.Version) {
		return fmt.Errorf("%s: name %q kind %q version %q", KrewManifest, m.Metadata.Name, m.Kind, m.Spec.Version)
	}
	var got []string
	var errs []error
	for _, p := range m.Spec.Platforms {
		plat := Platform{OS: p.Selector.MatchLabels["os"], Arch: p.Selector.MatchLabels["arch"]}
		got = append(got, plat.String())
		archive := filepath.Join(dir, path.Base(p.URI))
		if !strings.HasSuffix(p.URI, "/"+m.Spec.Version+"/"+ArchiveName(Release{Version: m.Spec.Version}, plat)) {
			errs = append(errs, fmt.Errorf("%s: uri %s is not this version's archive", plat, p.URI))
		}
		sum, err := fileSHA256(archive)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", plat, err))
			continue
		}
		if sum != p.SHA256 {
			errs = append(errs, fmt.Errorf("%s: %s has sha256 %s, the manifest says %s", plat, path.Base(p.URI), sum, p.SHA256))
		}
		names, err := archiveNames(archive)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if p.Bin != plat.exe("kubectl-upgradeguard") {
			errs = append(errs, fmt.Errorf("%s: bin %q, want %q", plat, p.Bin, plat.exe("kubectl-upgradeguard")))
		}
		for _, f := range append(p.Files, krewFile{From: p.Bin}) {
			if !slices.Contains(names, f.From) {
				errs = append(errs, fmt.Errorf("%s: %s lacks %s (it holds %v)", plat, path.Base(p.URI), f.From, names))
			}
		}
	}
	var wantS []string
	for _, p := range want {
		wantS = append(wantS, p.String())
	}
	slices.Sort(got)
	slices.Sort(wantS)
	if !slices.Equal(got, wantS) {
		errs = append(errs, fmt.Errorf("%s: platforms %v, want %v", KrewManifest, got, wantS))
	}
	return errors.Join(errs...)
}

func archiveNames(file string) ([]string, error) {
	var names []string
	if strings.HasSuffix(file, ".zip") {
		zr, err := zip.OpenReader(file)
		if err != nil {
			return nil, err
		}
		defer zr.Close()
		for _, f := range zr.File {
			names = append(names, f.Name)
		}
		return names, nil
	}
	f, err := os.Open(file)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	gz, err := gzip.NewReader(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	tr := tar.NewReader(gz)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return names, nil
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", file, err)
		}
		names = append(names, h.Name)
	}
}
