package chartmigrate

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"
)

// StateFile is the name of the migration record in the backup directory. The record sits
// beside the backup on purpose: the backup is what a restore needs, so the directory is
// the one thing to keep, and a re-run with the same directory resumes.
const StateFile = "migration-state.json"

// Step statuses in the record.
const (
	StatusRunning = "running"
	StatusDone    = "done"
	StatusFailed  = "failed"
)

// StepRecord is one step's record.
type StepRecord struct {
	Status string    `json:"status"`
	At     time.Time `json:"at"`
	Detail string    `json:"detail,omitempty"`
	Error  string    `json:"error,omitempty"`
}

// State is the migration record: the plan it carries out (made once, before anything
// changed, and reused on every re-run) and what each step did.
type State struct {
	Plan *Plan `json:"plan"`
	// NewPVCObjects are the new chart's rendered claims, by name: the base of the
	// pre-created claims.
	NewPVCObjects map[string]map[string]any `json:"newPVCObjects"`
	// OriginalReclaimPolicy records the PVs step 2 patched, with their old policy.
	OriginalReclaimPolicy map[string]string     `json:"originalReclaimPolicy,omitempty"`
	Steps                 map[string]StepRecord `json:"steps"`
}

// NewState starts a record for a plan.
func NewState(p *Plan) *State {
	st := &State{Plan: p, NewPVCObjects: map[string]map[string]any{}, Steps: map[string]StepRecord{}}
	for _, v := range p.Volumes {
		st.NewPVCObjects[v.NewPVC] = v.NewObject
	}
	return st
}

// Done says whether a step finished.
func (s *State) Done(step string) bool { return s.Steps[step].Status == StatusDone }

// Started says whether any step ran.
func (s *State) Started() bool { return len(s.Steps) > 0 }

// LoadState reads the record from dir; it returns nil and no error when there is none.
func LoadState(dir string) (*State, error) {
	data, err := os.ReadFile(filepath.Join(dir, StateFile))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read the migration record: %w", err)
	}
	var st State
	if err := json.Unmarshal(data, &st); err != nil {
		return nil, fmt.Errorf("%s is not a migration record: %w (move it away only if no migration is in progress)", filepath.Join(dir, StateFile), err)
	}
	if st.Plan == nil {
		return nil, fmt.Errorf("%s is not a migration record: it holds no plan (move it away only if no migration is in progress)", filepath.Join(dir, StateFile))
	}
	if st.Steps == nil {
		st.Steps = map[string]StepRecord{}
	}
	for i := range st.Plan.Volumes {
		st.Plan.Volumes[i].NewObject = st.NewPVCObjects[st.Plan.Volumes[i].NewPVC]
	}
	return &st, nil
}

// Save writes the record atomically (a temporary file renamed over the old one), so a
// crash never leaves half a record.
func (s *State) Save(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create the backup directory: %w", err)
	}
	data, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(dir, StateFile+".*")
	if err != nil {
		return fmt.Errorf("write the migration record: %w", err)
	}
	_, werr := tmp.Write(data)
	serr := tmp.Sync()
	cerr := tmp.Close()
	if err := errors.Join(werr, serr, cerr); err != nil {
		return errors.Join(fmt.Errorf("write the migration record: %w", err), os.Remove(tmp.Name()))
	}
	if err := os.Rename(tmp.Name(), filepath.Join(dir, StateFile)); err != nil {
		return errors.Join(fmt.Errorf("write the migration record: %w", err), os.Remove(tmp.Name()))
	}
	return nil
}
