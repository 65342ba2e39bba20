package admissionpolicy

import (
	"strings"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"

	"github.com/upgradeguard/upgradeguard/pkg/cmdline"
)

// WayKind is how a denial is got past.
type WayKind string

const (
	// WayDocumented is the exception the policy's authors document (Known).
	WayDocumented WayKind = "documented"
	// WayParam is the binding's parameter: the policy's own knob for what it allows.
	WayParam WayKind = "param"
	// WayChart is the chart change: the CRD the operation writes must satisfy the policy.
	WayChart WayKind = "chart"
	// WayKeep keeps a CRD whose deletion the policy denies: the operation leaves it (its
	// deployer's keep annotation, which the caller names), so the deletion is never asked
	// for; or the deletion goes through the exception the policy's rule allows.
	WayKeep WayKind = "keep"
)

// WayOn is the way past a denial, for people, with the command that starts it when there
// is one.
type WayOn struct {
	Kind WayKind `json:"kind"`
	// Advice says what to do and why.
	Advice string `json:"advice"`
	// Command is the first command to run, empty when the way is a change to make.
	Command string `json:"command,omitempty"`
	// Source is where the policy's authors document the exception (WayDocumented).
	Source string `json:"source,omitempty"`
}

// String words the way on: its advice, the command that starts it, and where the
// policy's authors document it.
func (w WayOn) String() string {
	s := w.Advice
	if w.Command != "" {
		s += ": " + w.Command
	}
	if w.Source != "" {
		s += " (" + w.Source + ")"
	}
	return s
}

// Known is a policy whose authors document the way past its denial.
type Known struct {
	// Policy is the ValidatingAdmissionPolicy's name.
	Policy string
	// Advice and Source are WayOn's.
	Advice, Source string
}

// known are the policies whose exception is documented upstream, by name.
var known = map[string]Known{
	"safe-upgrades.gateway.networking.k8s.io": {
		Policy: "safe-upgrades.gateway.networking.k8s.io",
		Advice: "Gateway API's policy refuses CRDs of a bundle older than v1.5.0 (and experimental CRDs over standard ones); its authors' way past it is to delete the policy first, " +
			"then apply the older CRDs (the rollback), and apply the policy again from the Gateway API release you install next",
		Source: "https://github.com/kubernetes-sigs/gateway-api/blob/v1.5.1/CHANGELOG/1.5-CHANGELOG.md (Upgrades and ValidatingAdmissionPolicy)",
	},
}

// wayOn is the way past one denial: the documented exception of a Known policy, else the
// binding's parameter when it has one, else the chart change (for a deletion: keeping
// the CRD).
func wayOn(policy *admissionregistrationv1.ValidatingAdmissionPolicy, b *admissionregistrationv1.ValidatingAdmissionPolicyBinding, d Denial) WayOn {
	if k, ok := known[policy.Name]; ok {
		return WayOn{Kind: WayDocumented, Advice: k.Advice, Source: k.Source,
			Command: cmdline.Delete{Resource: "validatingadmissionpolicy", Name: policy.Name}.String()}
	}
	if d.Param != "" && b != nil && b.Spec.ParamRef != nil {
		kind, name, _ := strings.Cut(d.Param, " ")
		ns := ""
		if before, after, ok := strings.Cut(name, "/"); ok {
			ns, name = before, after
		}
		return WayOn{Kind: WayParam,
			Advice:  "the policy reads its limits from " + d.Param + ", which binding " + b.Name + " gives it: change it there (its owner decides), and the write is judged again",
			Command: cmdline.Edit{Resource: strings.ToLower(kind), Name: name, Namespace: ns}.String()}
	}
	if d.Deletion() {
		return WayOn{Kind: WayKeep,
			Advice: "keep the CRD, so that the operation leaves it and its objects and never asks to delete it; to delete it all the same, " +
				"meet the exception the policy's rule allows (its message above) or ask the policy's owner for one",
			Command: cmdline.Get{Resource: "validatingadmissionpolicy", Name: policy.Name, Output: "yaml"}.String()}
	}
	return WayOn{Kind: WayChart,
		Advice: "change the chart so that the CRD it writes satisfies the policy's rule (the message above), or ask the policy's owner to exclude this CRD " +
			"(the binding's matchResources.excludeResourceRules): no migration helps",
		Command: cmdline.Get{Resource: "validatingadmissionpolicy", Name: policy.Name, Output: "yaml"}.String()}
}
