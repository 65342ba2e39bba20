package cli

import (
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"

	"github.com/upgradeguard/upgradeguard/internal/output"
	"github.com/upgradeguard/upgradeguard/pkg/admissionpolicy"
	"github.com/upgradeguard/upgradeguard/pkg/chartcrds"
	"github.com/upgradeguard/upgradeguard/pkg/check"
	"github.com/upgradeguard/upgradeguard/pkg/crdversions"
	"github.com/upgradeguard/upgradeguard/pkg/predict"
)

func renderText(w io.Writer, verbose bool, rep *check.Report) error {
	if err := renderCRDs(w, verbose, rep); err != nil {
		return err
	}
	renderBundled(w, rep)
	return nil
}

func renderCRDs(w io.Writer, verbose bool, rep *check.Report) error {
	findings := rep.Findings()
	fmt.Fprintf(w, "%s\n", title(rep))
	if len(rep.CRDs) == 0 {
		if rep.Manifests != nil {
			fmt.Fprintln(w, "The manifests bring no CRDs: nothing to check.")
		} else {
			fmt.Fprintln(w, "No CRDs are brought or dropped: nothing to check.")
		}
		renderManifests(w, rep.Manifests)
		return nil
	}
	switch {
	case rep.Safe && len(rep.Unasked) > 0:
		fmt.Fprintf(w, "NOT ALL ASKED: nothing that was asked refuses a CRD (%d checked), but %s.\n", len(rep.CRDs), unaskedHeadline(rep.Unasked))
	case rep.Safe && len(findings) > 0:
		fmt.Fprintf(w, "SAFE: nothing is deleted or refused now (%d checked); %d CRD(s) leave and wait for a sync that prunes.\n", len(rep.CRDs), len(findings))
	case rep.Safe:
		fmt.Fprintf(w, "SAFE: the API server accepts every CRD (%d checked).\n", len(rep.CRDs))
	default:
		fmt.Fprintf(w, "BLOCKED: %d of %d CRDs need action before the %s.\n", len(findings), len(rep.CRDs), rep.Operation)
	}
	rows := findings
	if verbose {
		rows = rep.CRDs
	}
	if len(rows) == 0 {
		fmt.Fprintln(w, "(use -v to list every CRD)")
		renderUnasked(w, rep.Unasked)
		renderManifests(w, rep.Manifests)
		return nil
	}
	return renderRows(w, verbose, rep, rows)
}

// renderManifests says what rendered manifests held besides the CRDs: how many objects,
// and those of kinds live CRDs serve that the manifests do not bring.
func renderManifests(w io.Writer, m *check.ManifestSummary) {
	if m == nil {
		return
	}
	fmt.Fprintf(w, "\nManifests: %d document(s), %d CRD(s), %d other object(s) (not judged for storage).\n", m.Documents, m.CRDs, m.Objects)
	for _, c := range m.LiveCRDObjects {
		fmt.Fprintf(w, "  %d %s object(s) of live CRD %s, which the manifests do not bring\n", c.Objects, c.Kind, c.CRD)
	}
}

// renderBundled lists the StorageVersionMigrations the chart renders, each with the CRD
// it covers, whether it will run, why, and what to do instead. They are advice: the
// verdicts above and the exit code do not depend on them.
func renderBundled(w io.Writer, rep *check.Report) {
	all := bundledOf(rep)
	if len(all) == 0 {
		return
	}
	fmt.Fprintln(w, "\nStorageVersionMigrations the chart bundles (advice; they do not change the verdicts):")
	for _, b := range all {
		name := b.Name
		if name == "" {
			name = "(generateName)"
		}
		fmt.Fprintf(w, "  %s (%s, %s) for %s: %s\n    why:  %s\n", name, b.APIVersion, orDash(b.File), b.CRD, b.Verdict, b.Reason)
		if b.Action != "" {
			fmt.Fprintf(w, "    next: %s\n", b.Action)
		}
	}
	if rep.BundledMigrationsUnknown {
		fmt.Fprintln(w, "  note: the cluster did not say which StorageVersionMigrations exist (none served, or not allowed to list them): a name already used would not run again")
	}
}

// bundledOf are every bundled StorageVersionMigration of a report: per CRD, then those
// with no CRD entry.
func bundledOf(rep *check.Report) []predict.BundledMigration {
	var all []predict.BundledMigration
	for _, c := range rep.CRDs {
		all = append(all, c.BundledMigrations...)
	}
	return append(all, rep.BundledMigrations...)
}

// renderRows is the table of CRDs, why each needs action and the next steps.
func renderRows(w io.Writer, verbose bool, rep *check.Report, rows []check.CRDReport) error {
	fmt.Fprintln(w)
	if rep.Manifests != nil {
		t := output.NewTable(w, "CRD", "VERDICT", "OBJECTS", "IN MANIFESTS", "STORED (LIVE)", "INCOMING")
		for _, c := range rows {
			t.Row(c.Name, c.Verdict, objects(c), inManifests(c), stored(c), incoming(c.IncomingVersions))
		}
		if err := t.Flush(); err != nil {
			return err
		}
	} else if err := crdTable(w, rows); err != nil {
		return err
	}
	if verbose {
		renderReasons(w, rows)
	} else {
		renderWhy(w, rep, rows)
	}
	for _, c := range rows {
		if c.ObjectsError != "" {
			fmt.Fprintf(w, "\nnote: objects of %s could not be counted: %s\n", c.Name, c.ObjectsError)
		}
		if c.SchemaError != "" {
			fmt.Fprintf(w, "\nnote: objects of %s could not be judged against the new schema: %s\n", c.Name, c.SchemaError)
		}
	}
	renderPolicies(w, rep.CRDs)
	renderUnasked(w, rep.Unasked)
	renderSchemas(w, rep.CRDs)
	renderManifests(w, rep.Manifests)
	renderNextSteps(w, rep.NextSteps)
	return nil
}

// unaskedHeadline words what was not asked (check.Report.Unasked) for a headline.
func unaskedHeadline(unasked []check.Unasked) string {
	var parts []string
	for _, u := range unasked {
		switch u.What {
		case check.UnaskedDryRun:
			parts = append(parts, fmt.Sprintf("the API server's admission webhooks were not asked about %d CRD(s) (only a dry-run write reaches them)", len(u.CRDs)))
		case check.UnaskedValidation:
			parts = append(parts, fmt.Sprintf("its own validation of %d of them was not asked (%s)", len(u.CRDs), u.Why))
		case check.UnaskedPolicies:
			parts = append(parts, fmt.Sprintf("its ValidatingAdmissionPolicies could not be read for %d of them", len(u.CRDs)))
		}
	}
	return strings.Join(parts, ", and ")
}

// renderUnasked says what was not asked (check.Report.Unasked): each question, the CRDs
// and why, and what lets this identity ask.
func renderUnasked(w io.Writer, unasked []check.Unasked) {
	if len(unasked) == 0 {
		return
	}
	fmt.Fprintln(w, "\nNot asked (the verdicts rest on what was asked):")
	for _, u := range unasked {
		switch u.What {
		case check.UnaskedDryRun:
			fmt.Fprintf(w, "  the API server's admission webhooks were not asked about %s (only a dry-run write reaches them; it needs update and create on customresourcedefinitions): %s\n",
				strings.Join(u.CRDs, ", "), u.Why)
			if u.Local != nil && u.Local.Stands() {
				fmt.Fprintf(w, "    its own validation of the CRDs was %s\n", u.Local)
			}
		case check.UnaskedValidation:
			fmt.Fprintf(w, "  the API server's own validation of %s was not asked: %s\n", strings.Join(u.CRDs, ", "), u.Why)
		case check.UnaskedPolicies:
			fmt.Fprintf(w, "  its ValidatingAdmissionPolicies were not evaluated for %s (they need list on validatingadmissionpolicies and validatingadmissionpolicybindings): %s\n",
				strings.Join(u.CRDs, ", "), u.Why)
		}
	}
}

// renderPolicies lists each admission policy denial once, with the CRDs it denies, its
// binding, its message and the way past it.
func renderPolicies(w io.Writer, crds []check.CRDReport) {
	var writes []deniedWrite
	for _, c := range crds {
		for _, d := range c.Policies {
			writes = append(writes, deniedWrite{crd: c.Name, denial: d})
		}
	}
	renderDenials(w, writes)
}

// deniedWrite is one CRD write that an admission policy denies.
type deniedWrite struct {
	crd    string
	denial admissionpolicy.Denial
}

// renderDenials lists each denial once, with the CRDs whose writes it denies, its binding,
// its message and the way past it (admissionpolicy.WayOn): for check's report and for a
// plan's blocked or detoured steps alike.
func renderDenials(w io.Writer, writes []deniedWrite) {
	type key struct {
		policy, binding, message string
		deletion                 bool
	}
	var order []key
	denied := map[key][]string{}
	way := map[key]admissionpolicy.WayOn{}
	for _, dw := range writes {
		d := dw.denial
		k := key{d.Policy, d.Binding, d.Message, d.Deletion()}
		if _, ok := denied[k]; !ok {
			order = append(order, k)
			way[k] = d.WayOn
		}
		if !slices.Contains(denied[k], dw.crd) {
			denied[k] = append(denied[k], dw.crd)
		}
	}
	for _, k := range order {
		verb := "writing"
		if k.deletion {
			verb = "deleting"
		}
		fmt.Fprintf(w, "\nValidatingAdmissionPolicy %s (binding %s) denies %s %s:\n  %s\n", k.policy, orDash(k.binding), verb, strings.Join(denied[k], ", "), k.message)
		renderWayOn(w, "  ", way[k])
	}
}

// renderWayOn is the way past one denial: its advice, the command that starts it and
// where the policy's authors document it.
func renderWayOn(w io.Writer, indent string, wo admissionpolicy.WayOn) {
	fmt.Fprintf(w, "%sway on (%s): %s\n", indent, wo.Kind, wo.Advice)
	if wo.Command != "" {
		fmt.Fprintf(w, "%s  %s\n", indent, wo.Command)
	}
	if wo.Source != "" {
		fmt.Fprintf(w, "%s  documented: %s\n", indent, wo.Source)
	}
}

func crdTable(w io.Writer, rows []check.CRDReport) error {
	t := output.NewTable(w, "CRD", "VERDICT", "OBJECTS", "STORED (LIVE)", "INCOMING")
	for _, c := range rows {
		t.Row(c.Name, c.Verdict, objects(c), stored(c), incoming(c.IncomingVersions))
	}
	return t.Flush()
}

// renderSchemas lists, per CRD, the stored fields the incoming schema drops and the
// objects whose next update it would refuse: paths, counts and a few names, no values.
func renderSchemas(w io.Writer, crds []check.CRDReport) {
	for _, c := range crds {
		s := c.Schema
		if s == nil || (!s.DataLoss() && !s.Warns() && len(s.ConversionFallbacks) == 0) {
			continue
		}
		fmt.Fprintf(w, "\n%s: %d objects judged against the incoming schema\n", c.Name, s.Objects)
		for _, p := range s.Pruned {
			fmt.Fprintf(w, "  data loss: %s is dropped at %s from %d objects (%s)\n", p.Path, p.Version, p.Objects, examples(p.Examples, p.Objects))
		}
		if s.ConversionRemoved != nil {
			fmt.Fprintf(w, "  data loss: %s\n", s.ConversionRemoved.Message)
		}
		for _, r := range s.Invalid {
			fmt.Fprintf(w, "  warning: %d objects would be refused their next update of %s at %s: %s (%s)\n",
				r.Objects, r.Path, r.Version, r.Message, examples(r.Examples, r.Objects))
		}
		for _, f := range s.ConversionFallbacks {
			fmt.Fprintf(w, "  not judged at %s: its conversion webhook did not answer, so the objects were read at the storage version %s instead\n",
				f.Version, f.ReadAt)
		}
	}
}

func examples(names []string, n int64) string {
	s := strings.Join(names, ", ")
	if more := n - int64(len(names)); more > 0 {
		s += fmt.Sprintf(" and %d more", more)
	}
	return s
}

func renderReasons(w io.Writer, rows []check.CRDReport) {
	for _, c := range rows {
		fmt.Fprintf(w, "\n%s (%s)\n  why:  %s\n", c.Name, c.Verdict, c.Reason)
		if c.Action != "" {
			fmt.Fprintf(w, "  next: %s\n", c.Action)
		}
	}
}

func renderNextSteps(w io.Writer, steps []string) {
	if len(steps) == 0 {
		return
	}
	fmt.Fprintln(w, "\nNext steps:")
	for i, s := range steps {
		fmt.Fprintf(w, "  %d. %s\n", i+1, s)
	}
}

// renderWhy explains each verdict once, with the CRDs it applies to; -v gives each CRD's
// own reason.
func renderWhy(w io.Writer, rep *check.Report, findings []check.CRDReport) {
	explain := map[predict.Verdict]string{
		predict.Migrate: "a stored version is dropped; migrating objects to the live storage version and pruning storedVersions fixes it",
		predict.Bridge:  "the live storage version itself is dropped; the storage version must move first",
		predict.Delete:  "the CRD leaves the release (the target no longer renders it from templates/; crds/ is never part of a release): Helm deletes it and every object of its type (OBJECTS)",
		predict.DataLoss: "the incoming schema no longer declares fields that stored objects hold: they are hidden at once " +
			"and gone from etcd at each object's next write",
		predict.Refused: "the API server refuses the incoming CRD itself (its schema or a CEL rule, by the rules of its Kubernetes minor): " +
			"the operation would fail at that CRD, after what was applied before it; no migration helps",
		predict.Move: "the CRD moves from one Helm release to another: keep it on the side it leaves and move Helm's ownership metadata to the release it joins, " +
			"first (crd adopt), or Helm deletes it with every object of its type (OBJECTS) or refuses it",
		predict.PolicyDenied: "an admission policy of the cluster (a ValidatingAdmissionPolicy) denies writing the incoming CRD: " +
			"the operation would fail at that CRD, after what was applied before it; no migration and no other Kubernetes minor helps (the way on is below)",
		predict.Prune: "the CRD leaves the Application, but this sync does not prune it: it stays, OutOfSync, until a sync that prunes " +
			"deletes it and every object of its type (OBJECTS)",
	}
	if rep.Deployer.Kind == predict.KindArgoCD {
		explain[predict.Delete] = "the Application's chart no longer renders the CRD (from templates/ or crds/, both part of the Application) and its sync prunes it: Argo CD deletes it " +
			"and every object of its type (OBJECTS)"
	}
	if slices.ContainsFunc(findings, func(c check.CRDReport) bool { return c.Refusal != nil && c.Refusal.Local != nil }) {
		explain[predict.Refused] += "; where this identity may not make the dry run that asks it, its validation code was evaluated here (-v says by which minor's rules)"
	}
	fmt.Fprintln(w, "\nWhy:")
	for _, v := range []predict.Verdict{predict.Delete, predict.Move, predict.PolicyDenied, predict.Refused, predict.DataLoss, predict.Migrate, predict.Bridge, predict.Prune} {
		n := 0
		for _, c := range findings {
			if c.Verdict == v {
				n++
			}
		}
		if n > 0 {
			fmt.Fprintf(w, "  %-8s %d CRD(s): %s\n", v, n, explain[v])
		}
	}
	fmt.Fprintln(w, "  (-v shows the reason for each CRD)")
}

func title(rep *check.Report) string {
	var b strings.Builder
	b.WriteString(strings.ToUpper(string(rep.Operation[:1])) + string(rep.Operation[1:]))
	if rep.Application != "" {
		fmt.Fprintf(&b, " of Argo CD Application %s", rep.Application)
		if rep.Namespace != "" {
			fmt.Fprintf(&b, " (namespace %s)", rep.Namespace)
		}
	}
	if rep.Release != "" {
		fmt.Fprintf(&b, " of release %s", rep.Release)
		if rep.Namespace != "" {
			fmt.Fprintf(&b, " (namespace %s)", rep.Namespace)
		}
	}
	b.WriteString(target(rep))
	return b.String()
}

// target is the title's last part: the revisions of a rollback, the chart of an upgrade.
func target(rep *check.Report) string {
	var b strings.Builder
	switch {
	case rep.Operation == predict.Rollback:
		fmt.Fprintf(&b, ": revision %d -> %d", rep.FromRevision, rep.ToRevision)
		if rep.Chart != "" {
			fmt.Fprintf(&b, " (%s %s)", rep.Chart, rep.ChartVersion)
		}
	case rep.Chart != "":
		fmt.Fprintf(&b, " to %s %s", rep.Chart, rep.ChartVersion)
	case rep.Manifests != nil:
		files := make([]string, len(rep.Manifests.Files))
		for i, f := range rep.Manifests.Files {
			files[i] = f
			if f == chartcrds.Stdin {
				files[i] = "standard input"
			}
		}
		fmt.Fprintf(&b, " to the rendered manifests in %s (every CRD applied)", strings.Join(files, ", "))
	}
	return b.String()
}

func objects(c check.CRDReport) string {
	switch {
	case c.Objects != nil:
		return strconv.FormatInt(*c.Objects, 10)
	case c.ObjectsError != "":
		return "?"
	}
	return "-"
}

// inManifests is how many objects of the CRD's kind the rendered manifests carry.
func inManifests(c check.CRDReport) string {
	if c.ManifestObjects == nil {
		return "-"
	}
	return strconv.Itoa(*c.ManifestObjects)
}

func stored(c check.CRDReport) string {
	if len(c.LiveStoredVersions) == 0 {
		return "(new)"
	}
	return strings.Join(c.LiveStoredVersions, ",") + " [storage " + c.LiveStorageVersion + "]"
}

func incoming(vs []crdversions.Version) string {
	if len(vs) == 0 {
		return "(dropped)"
	}
	parts := make([]string, 0, len(vs))
	for _, v := range vs {
		parts = append(parts, v.String())
	}
	return strings.Join(parts, " ")
}
