package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	svmv1 "k8s.io/api/storagemigration/v1"
	apiextclient "k8s.io/apiextensions-apiserver/pkg/client/clientset/clientset"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/upgradeguard/upgradeguard/internal/testenv"
)

// builtinControllers are what the built-in migrator needs in kube-controller-manager: the
// storage-version-migrator-controller reads resource versions through the garbage
// collector's monitors.
var builtinControllers = []string{"storage-version-migrator-controller", "garbage-collector-controller"}

// kcmUsage is what the built-in migration cost kube-controller-manager.
type kcmUsage struct {
	cpuSeconds          float64
	rssBefore, rssAfter int64 // KiB
	hwm                 int64 // KiB, the process's peak since it started
	succeeded, pruned   time.Duration
}

// benchBuiltin is case (f): a StorageVersionMigration (storagemigration.k8s.io/v1) for
// the bench resource, created as an administrator, timed from its creation to Succeeded
// and to storedVersions pruned to [v1], with kube-controller-manager's CPU seconds and
// RSS over that time. kube-controller-manager runs at its default client limits
// (--kube-api-qps 20). It returns a nil usage when the API is not served (before 1.37).
func benchBuiltin(ctx context.Context, cp *testenv.ControlPlane, p *probe) (procResult, *kcmUsage, error) {
	kube := kubernetes.NewForConfigOrDie(cp.Config)
	if ok, err := builtinRunning(ctx, cp, "(f)"); !ok || err != nil {
		return procResult{}, nil, err
	}
	pid := cp.ControllerManagerPID()
	name := "(f) built-in StorageVersionMigration"
	fmt.Printf("running %s ...\n", name)
	u := &kcmUsage{rssBefore: procStatus(pid, "VmRSS:")}
	cpu0, err := cpuSeconds(pid)
	if err != nil {
		return procResult{}, nil, err
	}
	svms := kube.StoragemigrationV1().StorageVersionMigrations()
	start := time.Now()
	svm, err := svms.Create(ctx, &svmv1.StorageVersionMigration{ObjectMeta: metav1.ObjectMeta{GenerateName: "bench-"},
		Spec: svmv1.StorageVersionMigrationSpec{Resource: metav1.GroupResource{Group: benchGVR.Group, Resource: benchGVR.Resource}}}, metav1.CreateOptions{})
	if err != nil {
		return procResult{}, nil, err
	}
	defer func() { _ = svms.Delete(context.WithoutCancel(ctx), svm.Name, metav1.DeleteOptions{}) }()
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Hour, true, func(ctx context.Context) (bool, error) {
		got, err := svms.Get(ctx, svm.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		if c := meta.FindStatusCondition(got.Status.Conditions, string(svmv1.MigrationFailed)); c != nil && c.Status == metav1.ConditionTrue {
			return false, fmt.Errorf("StorageVersionMigration %s failed: %s: %s", got.Name, c.Reason, c.Message)
		}
		return meta.IsStatusConditionTrue(got.Status.Conditions, string(svmv1.MigrationSucceeded)), nil
	})
	if err != nil {
		return procResult{}, nil, err
	}
	u.succeeded = time.Since(start)
	crds := apiextclient.NewForConfigOrDie(cp.Config).ApiextensionsV1().CustomResourceDefinitions()
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 5*time.Minute, true, func(ctx context.Context) (bool, error) {
		crd, err := crds.Get(ctx, benchCRD, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		return slices.Equal(crd.Status.StoredVersions, []string{"v1"}), nil
	})
	if err != nil {
		return procResult{}, nil, fmt.Errorf("storedVersions of %s not pruned after the StorageVersionMigration succeeded: %w", benchCRD, err)
	}
	u.pruned = time.Since(start)
	cpu1, err := cpuSeconds(pid)
	if err != nil {
		return procResult{}, nil, err
	}
	u.cpuSeconds, u.rssAfter, u.hwm = cpu1-cpu0, procStatus(pid, "VmRSS:"), procStatus(pid, "VmHWM:")
	r := procResult{name: name, start: start, elapsed: u.pruned, probeP99: p.p99(start, start.Add(u.pruned))}
	return r, u, nil
}

// builtinRunning makes sure the built-in migrator runs: false when the API is not served
// (before 1.37, and the case is skipped), else kube-controller-manager with
// builtinControllers started if it is not running, and settled.
func builtinRunning(ctx context.Context, cp *testenv.ControlPlane, bcase string) (bool, error) {
	kube := kubernetes.NewForConfigOrDie(cp.Config)
	if _, err := kube.Discovery().ServerResourcesForGroupVersion(svmv1.SchemeGroupVersion.String()); err != nil {
		fmt.Printf("%s is not served on Kubernetes 1.%d: skipping %s\n", svmv1.SchemeGroupVersion, cp.Minor, bcase)
		return false, nil
	}
	if cp.ControllerManagerPID() == 0 {
		fmt.Println("starting kube-controller-manager with", strings.Join(builtinControllers, ","), "...")
		if err := cp.StartControllerManager(builtinControllers...); err != nil {
			return false, err
		}
	}
	return true, settle(ctx, cp.ControllerManagerPID())
}

// settle waits until kube-controller-manager has finished starting (its informers have
// listed everything): less than a tenth of a CPU second used over a second, or two minutes.
func settle(ctx context.Context, pid int) error {
	last, err := cpuSeconds(pid)
	if err != nil {
		return err
	}
	return wait.PollUntilContextTimeout(ctx, time.Second, 2*time.Minute, false, func(context.Context) (bool, error) {
		now, err := cpuSeconds(pid)
		if err != nil {
			return false, err
		}
		quiet := now-last < 0.1
		last = now
		return quiet, nil
	})
}

// cpuSeconds is the user and system CPU time of a process, from /proc/PID/stat (in clock
// ticks of 1/100 s, Linux's USER_HZ).
func cpuSeconds(pid int) (float64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name is in parentheses and may hold spaces: fields follow the last ')'.
	i := strings.LastIndexByte(string(data), ')')
	if i < 0 {
		return 0, errors.New("unexpected /proc/PID/stat format")
	}
	f := strings.Fields(string(data[i+1:]))
	if len(f) < 13 {
		return 0, errors.New("unexpected /proc/PID/stat format")
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64) // field 14
	stime, err2 := strconv.ParseInt(f[12], 10, 64) // field 15
	if err := errors.Join(err1, err2); err != nil {
		return 0, err
	}
	return float64(utime+stime) / 100, nil
}

// procStatus reads one "Vm...:" line (KiB) of /proc/PID/status.
func procStatus(pid int, key string) int64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, key); ok {
			n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return n
		}
	}
	return 0
}
