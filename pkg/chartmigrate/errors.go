package chartmigrate

import "fmt"

// ConfirmationError says a step needs the operator's agreement (Env.Confirm) and nobody
// could give it.
type ConfirmationError struct {
	Question string
}

func (e *ConfirmationError) Error() string {
	return "nobody confirmed: " + e.Question
}

// MissingSecretError says a Secret the plan pairs is not on the cluster: there is
// nothing to carry over under that name (map it to another one, or restore it first).
type MissingSecretError struct {
	Namespace, Name string
}

func (e *MissingSecretError) Error() string {
	return fmt.Sprintf("Secret %s/%s of the old release is not on the cluster: there is nothing to carry over (pair another Secret, or restore it first)", e.Namespace, e.Name)
}

// RecordMismatchError says a backup directory records another migration than the one
// asked for: resuming it would carry out someone else's plan.
type RecordMismatchError struct {
	Dir                            string
	Namespace, Release, NewRelease string
}

func (e *RecordMismatchError) Error() string {
	return fmt.Sprintf("%s records the migration of %s/%s to %s, not this one", e.Dir, e.Namespace, e.Release, e.NewRelease)
}
