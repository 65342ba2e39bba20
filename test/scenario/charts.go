package scenario

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/upgradeguard/upgradeguard/internal/testenv"
	"github.com/upgradeguard/upgradeguard/internal/testenv/servers"
)

// kyvernoCRDs are the kyverno CRD fixture sets (crds/kyverno/APP) of each chart version.
var kyvernoCRDs = map[string]string{"3.2.8": "v1.12.6", "3.3.7": "v1.13.4"}

// ChartFiles are the files of a real upstream chart release, read from the fixtures, as
// a chart repository holds them (path in the chart -> content):
//
//	flux2 2.17.2, 2.18.2, 2.18.3  Chart.yaml, values.yaml and the CRD templates; 2.18.3's
//	                              migration hook is the fixture's rendering of it under
//	                              the chart's condition (the copy lacks its helpers)
//	kyverno 3.2.8, 3.3.7          Chart.yaml, values.yaml, the CRDs of its app version
//	                              (v1.12.6, v1.13.4) in its crds subchart, and its
//	                              post-upgrade hook likewise
//	lws 0.7.0, 0.8.0              the whole chart
//
// The fixtures' rendered/ folders are not chart files and are left out.
func ChartFiles(chart, version string) (map[string]string, error) {
	fx, err := testenv.Fixtures()
	if err != nil {
		return nil, err
	}
	src := filepath.Join(fx, "charts", chart+"-"+version)
	files := map[string]string{}
	err = filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil || strings.HasPrefix(rel, "rendered"+string(filepath.Separator)) {
			return err
		}
		b, err := os.ReadFile(p)
		files[filepath.ToSlash(rel)] = string(b)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("chart %s %s from the fixtures: %w", chart, version, err)
	}
	rendered := func(name string) (string, error) {
		b, err := os.ReadFile(filepath.Join(src, "rendered", name))
		return string(b), err
	}
	switch chart {
	case "flux2":
		if _, ok := files["templates/pre-upgrade-migrate-resources.yaml"]; ok {
			hook, err := rendered("pre-upgrade-migrate-hook.yaml")
			if err != nil {
				return nil, err
			}
			files["templates/pre-upgrade-migrate-resources.yaml"] = "{{- if .Values.crds.migration.enabled }}\n" + hook + "\n{{- end }}\n"
		}
	case "kyverno":
		app, ok := kyvernoCRDs[version]
		if !ok {
			return nil, fmt.Errorf("no kyverno %s in the fixtures", version)
		}
		crds, err := os.ReadDir(filepath.Join(fx, "crds", "kyverno", app))
		if err != nil {
			return nil, err
		}
		for _, e := range crds {
			b, err := os.ReadFile(filepath.Join(fx, "crds", "kyverno", app, e.Name()))
			if err != nil {
				return nil, err
			}
			files["charts/crds/templates/"+e.Name()] = string(b)
		}
		// The real chart's CRDs come from its crds subchart; grafana is its other dependency.
		files["charts/crds/Chart.yaml"] = "apiVersion: v2\nname: crds\nversion: " + version + "\n"
		files["charts/grafana/Chart.yaml"] = "apiVersion: v2\nname: grafana\nversion: " + version + "\n"
		hook, err := rendered("post-upgrade-migrate-hook.yaml")
		if err != nil {
			return nil, err
		}
		files["templates/hooks/post-upgrade-migrate-resources.yaml"] = "{{- if .Values.crds.migration.enabled }}\n{{- if not .Values.templating.enabled }}\n" + hook + "\n{{- end }}\n{{- end }}\n"
	}
	return files, nil
}

// ChartRepo serves a Helm chart repository on loopback from dir holding the fixture
// charts named (as "flux2-2.17.2", folders of the fixtures' charts/), packaged and
// indexed as a publisher releases them. Close stops it.
func ChartRepo(dir string, charts ...string) (*servers.ChartRepo, error) {
	fx, err := testenv.Fixtures()
	if err != nil {
		return nil, err
	}
	r, err := servers.NewChartRepo(dir)
	if err != nil {
		return nil, err
	}
	for _, c := range charts {
		if err := r.Add(filepath.Join(fx, "charts", c)); err != nil {
			r.Close()
			return nil, err
		}
	}
	return r, nil
}
