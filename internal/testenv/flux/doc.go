// Package flux runs Flux's real source-controller and helm-controller (bin/flux, built by
// `make testbin`) as processes outside the cluster against a control plane of
// internal/testenv, and builds the Flux objects tests create (HelmRepository,
// OCIRepository, HelmRelease).
//
// Start (StartControllers without a testing.TB) applies Flux's CRDs (CRDsFixture) and
// starts both controllers with leader election off, their metrics, health and (for
// source-controller) artifacts on free loopback ports, and their homes, artifacts and
// logs in a directory under the control plane's (testenv.ControlPlane.Dir).
//
// Flux.Stop, which Start registers with t.Cleanup, stops helm-controller and then
// source-controller (SIGTERM, then SIGKILL). It leaves Flux's CRDs and objects in the
// control plane, and the files in the control plane's directory: the control plane's Stop
// removes both. If the test binary is killed, the controllers die with it
// (internal/childproc); the control plane's directory stays in the temporary directory.
package flux
