package cliflag_test

import (
	"io"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/upgradeguard/upgradeguard/internal/cliflag"
	"github.com/upgradeguard/upgradeguard/pkg/chartsource"
	"github.com/upgradeguard/upgradeguard/pkg/check"
	"github.com/upgradeguard/upgradeguard/pkg/helmrelease"
	"github.com/upgradeguard/upgradeguard/pkg/migrate"
)

// command is a cobra command that records whether it ran.
func command(ran *bool) *cobra.Command {
	cmd := &cobra.Command{Use: "t", SilenceUsage: true, SilenceErrors: true, RunE: func(*cobra.Command, []string) error {
		*ran = true
		return nil
	}}
	cmd.SetOut(io.Discard)
	cmd.SetErr(io.Discard)
	return cmd
}

func TestHelmDriver(t *testing.T) {
	for _, tc := range []struct {
		name    string
		env     string
		args    []string
		want    helmrelease.Driver
		wantErr string
	}{
		{name: "default", want: helmrelease.DriverSecret},
		{name: "from HELM_DRIVER", env: "configmap", want: helmrelease.DriverConfigMap},
		{name: "flag over HELM_DRIVER", env: "configmap", args: []string{"--helm-driver", "secret"}, want: helmrelease.DriverSecret},
		{name: "Helm's plural", args: []string{"--helm-driver=configmaps"}, want: helmrelease.DriverConfigMap},
		{name: "unknown flag value", args: []string{"--helm-driver", "sql"},
			wantErr: `invalid argument "sql" for "--helm-driver" flag: unknown Helm storage driver "sql": use secret or configmap`},
		{name: "unknown HELM_DRIVER", env: "memory",
			wantErr: `HELM_DRIVER=memory: unknown Helm storage driver "memory": use secret or configmap, or pass --helm-driver`},
		{name: "flag over an unknown HELM_DRIVER", env: "memory", args: []string{"--helm-driver", "configmap"}, want: helmrelease.DriverConfigMap},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(cliflag.HelmDriverEnv, tc.env)
			var ran bool
			cmd := command(&ran)
			d := cliflag.AddHelmDriver(cmd)
			cmd.SetArgs(tc.args)
			err := cmd.Execute()
			switch {
			case tc.wantErr != "":
				if err == nil || err.Error() != tc.wantErr || ran {
					t.Errorf("error %v (ran %v), want %q before the command runs", err, ran, tc.wantErr)
				}
			case err != nil || !ran:
				t.Errorf("error %v (ran %v)", err, ran)
			case d.Driver() != tc.want || cliflag.DriverOf(cmd.Flags()) != tc.want:
				t.Errorf("driver %q (DriverOf %q), want %q", d.Driver(), cliflag.DriverOf(cmd.Flags()), tc.want)
			}
		})
	}
}

// TestHelmDriverKeepsPreRun: the HELM_DRIVER check runs before the command's own pre-run
// hook, which still runs.
func TestHelmDriverKeepsPreRun(t *testing.T) {
	t.Setenv(cliflag.HelmDriverEnv, "")
	var ran, pre bool
	cmd := command(&ran)
	cmd.PreRunE = func(*cobra.Command, []string) error { pre = true; return nil }
	cliflag.AddHelmDriver(cmd)
	cmd.SetArgs(nil)
	if err := cmd.Execute(); err != nil || !pre || !ran {
		t.Errorf("error %v, pre-run %v, ran %v", err, pre, ran)
	}
}

// TestHelmDriverHelp: help shows no default when HELM_DRIVER is unset (the usage says
// it), and HELM_DRIVER's value when it is set.
func TestHelmDriverHelp(t *testing.T) {
	for env, want := range map[string]string{
		"":          "(default $HELM_DRIVER, else secret)\n",
		"configmap": `(default $HELM_DRIVER, else secret) (default "configmap")`,
	} {
		t.Setenv(cliflag.HelmDriverEnv, env)
		var ran bool
		cmd := command(&ran)
		cliflag.AddHelmDriver(cmd)
		if got := cmd.Flags().FlagUsages(); !strings.Contains(got, want) {
			t.Errorf("HELM_DRIVER=%q: help %q, want %q", env, got, want)
		}
	}
}

func TestCompletion(t *testing.T) {
	t.Setenv(cliflag.HelmDriverEnv, "")
	var ran bool
	cmd := command(&ran)
	cliflag.AddHelmDriver(cmd)
	var policy check.CRDPolicy
	cliflag.AddCRDPolicy(cmd, &policy, cliflag.CRDPolicyUsage)
	for flag, want := range map[string][]string{
		"helm-driver": {"secret", "configmap"},
		"crd-policy":  {"helm", "create-replace"},
	} {
		fn, ok := cmd.GetFlagCompletionFunc(flag)
		if !ok {
			t.Errorf("--%s has no completion", flag)
			continue
		}
		got, _ := fn(cmd, nil, "")
		if strings.Join(got, ",") != strings.Join(want, ",") {
			t.Errorf("--%s completes %v, want %v", flag, got, want)
		}
	}
}

func TestCRDPolicy(t *testing.T) {
	for _, tc := range []struct {
		args    []string
		want    check.CRDPolicy
		wantErr string
	}{
		{nil, check.PolicyHelm, ""},
		{[]string{"--crd-policy", "create-replace"}, check.PolicyCreateReplace, ""},
		{[]string{"--crd-policy=helm"}, check.PolicyHelm, ""},
		{[]string{"--crd-policy", "Replace"}, "", `invalid argument "Replace" for "--crd-policy" flag: unknown CRD policy "Replace": use helm (plain Helm) or create-replace`},
	} {
		var ran bool
		cmd := command(&ran)
		var policy check.CRDPolicy
		cliflag.AddCRDPolicy(cmd, &policy, cliflag.CRDPolicyUsage)
		cmd.SetArgs(tc.args)
		err := cmd.Execute()
		switch {
		case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr) || ran):
			t.Errorf("%v: error %v (ran %v), want %q", tc.args, err, ran, tc.wantErr)
		case tc.wantErr == "" && (err != nil || policy != tc.want):
			t.Errorf("%v: %q %v, want %q", tc.args, policy, err, tc.want)
		}
	}
}

// TestEngine: the two --engine flags default, parse and refuse through pkg/migrate, when
// the flags are parsed.
func TestEngine(t *testing.T) {
	for _, tc := range []struct {
		use     cliflag.EngineUse
		args    []string
		want    migrate.Engine
		wantErr string
	}{
		{cliflag.RunEngine, nil, migrate.EngineAuto, ""},
		{cliflag.RunEngine, []string{"--engine", "builtin"}, migrate.EngineBuiltin, ""},
		{cliflag.RunEngine, []string{"--engine=client"}, migrate.EngineClient, ""},
		{cliflag.RunEngine, []string{"--engine", "svm"}, "", `invalid argument "svm" for "--engine" flag: unknown migration engine "svm": use auto, client or builtin`},
		{cliflag.RoleEngine, nil, migrate.EngineClient, ""},
		{cliflag.RoleEngine, []string{"--engine", "builtin"}, migrate.EngineBuiltin, ""},
		{cliflag.RoleEngine, []string{"--engine", "auto"}, "", `migration engine "auto" has no role of its own: use client or builtin`},
		{cliflag.RoleEngine, []string{"--engine", "svm"}, "", `unknown migration engine "svm"`},
	} {
		var ran bool
		cmd := command(&ran)
		var engine migrate.Engine
		cliflag.AddEngine(cmd, tc.use, &engine)
		cmd.SetArgs(tc.args)
		err := cmd.Execute()
		switch {
		case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr) || ran):
			t.Errorf("%v: error %v (ran %v), want %q", tc.args, err, ran, tc.wantErr)
		case tc.wantErr == "" && (err != nil || engine != tc.want):
			t.Errorf("%v: %q %v, want %q", tc.args, engine, err, tc.want)
		}
		fn, _ := cmd.GetFlagCompletionFunc(cliflag.EngineFlag)
		if got, _ := fn(cmd, nil, ""); len(got) != len(tc.use.Engines) || got[0] != string(tc.use.Engines[0]) {
			t.Errorf("--engine completes %v, want %v", got, tc.use.Engines)
		}
	}
}

func TestChartSource(t *testing.T) {
	for _, ref := range []cliflag.ChartRef{cliflag.Chart, cliflag.ToChart} {
		var ran bool
		cmd := command(&ran)
		var src chartsource.Options
		cliflag.AddChartSource(cmd.Flags(), ref, &src)
		cmd.SetArgs([]string{"--" + ref.Name, "app", "--repo", "https://charts.example", "--version", "~1.2",
			"-f", "a.yaml", "--set", "a=1", "--set-string", "b=2", "--set-file", "c=f", "--set-json", `d={}`,
			"--username", "u", "--password", "p", "--ca-file", "ca.pem", "--cert-file", "c.pem", "--key-file", "k.pem",
			"--insecure-skip-tls-verify-chart", "--plain-http"})
		if err := cmd.Execute(); err != nil {
			t.Fatalf("--%s: %v", ref.Name, err)
		}
		want := chartsource.Options{Ref: "app", RepoURL: "https://charts.example", Version: "~1.2",
			Username: "u", Password: "p", CAFile: "ca.pem", CertFile: "c.pem", KeyFile: "k.pem", InsecureSkipTLSVerify: true, PlainHTTP: true}
		want.Values.ValueFiles, want.Values.Values, want.Values.StringValues = []string{"a.yaml"}, []string{"a=1"}, []string{"b=2"}
		want.Values.FileValues, want.Values.JSONValues = []string{"c=f"}, []string{`d={}`}
		if diff := cmp.Diff(want, src); diff != "" {
			t.Errorf("--%s (-want +got):\n%s", ref.Name, diff)
		}
	}
}

// TestManifestsConflict: --manifests refuses every flag of the chart-source set (so a
// flag added to AddChartSource is refused too) and the command's own release flags.
func TestManifestsConflict(t *testing.T) {
	for _, ref := range []cliflag.ChartRef{cliflag.Chart, cliflag.ToChart} {
		var src chartsource.Options
		var manifests, release string
		cmd := &cobra.Command{Use: "t"}
		cliflag.AddChartSource(cmd.Flags(), ref, &src)
		cliflag.AddManifests(cmd, &manifests)
		cmd.Flags().StringVar(&release, "release", "", "")
		cmd.Flags().VisitAll(func(f *pflag.Flag) {
			if f.Name == cliflag.ManifestsFlag || f.Name == "release" {
				return
			}
			fs := cmd.Flags()
			if err := fs.Set(f.Name, "true"); err != nil {
				t.Fatalf("set --%s: %v", f.Name, err)
			}
			defer func() { f.Changed = false }()
			err := cliflag.ManifestsConflict(fs)
			if err == nil || !strings.Contains(err.Error(), "--manifests and --"+f.Name+" do not go together") || !strings.Contains(err.Error(), "drop --"+f.Name) {
				t.Errorf("--%s with --manifests: %v", f.Name, err)
			}
		})
		if err := cliflag.ManifestsConflict(cmd.Flags(), "release"); err != nil {
			t.Errorf("nothing set: %v", err)
		}
		if err := cmd.Flags().Set("release", "x"); err != nil {
			t.Fatal(err)
		}
		if err := cliflag.ManifestsConflict(cmd.Flags(), "release"); err == nil || !strings.Contains(err.Error(), "--release") {
			t.Errorf("--release with --manifests: %v", err)
		}
	}
}
