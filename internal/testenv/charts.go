package testenv

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"helm.sh/helm/v4/pkg/chart/loader"
	chart "helm.sh/helm/v4/pkg/chart/v2"
	chartutil "helm.sh/helm/v4/pkg/chart/v2/util"
)

// WriteChart writes a chart directory dir/name with a Chart.yaml for version and the given
// extra files (path -> content), and returns its path.
func WriteChart(dir, name, version string, files map[string]string) (string, error) {
	root := filepath.Join(dir, name)
	all := map[string]string{
		"Chart.yaml": fmt.Sprintf("apiVersion: v2\nname: %s\nversion: %s\nappVersion: %q\n", name, version, version),
	}
	for k, v := range files {
		all[k] = v
	}
	for path, content := range all {
		p := filepath.Join(root, path)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return "", err
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			return "", err
		}
	}
	return root, nil
}

// FixtureChart writes a chart whose templates/ holds the given fixture files unchanged,
// the way the flux2 community chart ships its CRDs.
func FixtureChart(dir, name, version string, fixtureFiles ...string) (string, error) {
	fx, err := Fixtures()
	if err != nil {
		return "", err
	}
	files := map[string]string{}
	for i, f := range fixtureFiles {
		data, err := os.ReadFile(filepath.Join(fx, f))
		if err != nil {
			return "", err
		}
		files[fmt.Sprintf("templates/%02d-%s", i, filepath.Base(f))] = string(data)
	}
	return WriteChart(dir, name, version, files)
}

// Package packages a chart directory into outDir and returns the .tgz path.
func Package(chartDir, outDir string) (string, error) {
	ch, err := loader.Load(chartDir)
	if err != nil {
		return "", err
	}
	c, ok := ch.(*chart.Chart)
	if !ok {
		return "", fmt.Errorf("unsupported chart %T", ch)
	}
	return chartutil.Save(c, outDir)
}

// RegroupedFixtureChart writes a chart whose one template is a fixture CRD file with its
// API group renamed from one group to another, so that a test can install a real upstream
// CRD without meeting the upstream CRD another test of its package installs.
func RegroupedFixtureChart(dir, name, version, fixtureFile, from, to string) (string, error) {
	fx, err := Fixtures()
	if err != nil {
		return "", err
	}
	data, err := os.ReadFile(filepath.Join(fx, fixtureFile))
	if err != nil {
		return "", err
	}
	return WriteChart(dir, name, version, map[string]string{"templates/crd.yaml": strings.ReplaceAll(string(data), from, to)})
}
