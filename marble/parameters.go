package marble

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"

	"github.com/quarry-cc/quarry/api/marblepb"
)

// DefaultArg0 is the command line a Marble gets when the manifest gives no
// Argv (MarbleRun's premain sets the same).
const DefaultArg0 = "./marble"

// Parameters are what the Coordinator hands an activated Marble: the
// manifest's Files and Env rendered for this activation (Env includes the
// MARBLE_PREDEFINED_* variables and MARBLE_TTLS_CONFIG) and its Argv.
type Parameters struct {
	Files map[string][]byte // path -> content
	Env   map[string][]byte // name -> value
	Argv  []string
	// UUID is the Marble's UUID (canonical form) that Activate sent: the
	// one in Options.UUIDFile, which keeps it across restarts. It is also
	// the common name of the Marble's certificate.
	UUID string
	// FileRoots are the directories (absolute paths) under which
	// WriteFiles writes files with absolute paths. Activate sets it
	// (Options.FileRoots); empty allows relative paths only.
	FileRoots []string
}

// fromWire converts the wire message; nil gives empty Parameters.
func fromWire(p *marblepb.Parameters) *Parameters {
	return &Parameters{Files: p.GetFiles(), Env: p.GetEnv(), Argv: p.GetArgv()}
}

// Apply applies the parameters to this process as MarbleRun's premain
// does: it writes the Files (WriteFiles), sets the Env with os.Setenv, and
// returns the command line the Marble is to run (Args). Nothing is set if a
// variable is invalid; files written before a failure stay.
func (p *Parameters) Apply() ([]string, error) {
	if err := p.checkEnv(); err != nil {
		return nil, err
	}
	if err := p.WriteFiles(); err != nil {
		return nil, err
	}
	for _, name := range slices.Sorted(maps.Keys(p.Env)) {
		if err := os.Setenv(name, string(p.Env[name])); err != nil {
			return nil, fmt.Errorf("marble: setting %s: %w", name, err)
		}
	}
	return p.Args(), nil
}

// Environ returns base (KEY=VALUE entries, as os.Environ gives them) with
// the Env variables set: entries of base with the same name are dropped,
// and the Env entries follow in name order. It fails if a name is empty or
// contains '=' or NUL, or a value contains NUL, naming the variable.
func (p *Parameters) Environ(base []string) ([]string, error) {
	if err := p.checkEnv(); err != nil {
		return nil, err
	}
	out := make([]string, 0, len(base)+len(p.Env))
	for _, kv := range base {
		name, _, _ := strings.Cut(kv, "=")
		if _, ok := p.Env[name]; !ok {
			out = append(out, kv)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(p.Env)) {
		out = append(out, name+"="+string(p.Env[name]))
	}
	return out, nil
}

// checkEnv checks that every Env entry can be an environment variable.
func (p *Parameters) checkEnv() error {
	for _, name := range slices.Sorted(maps.Keys(p.Env)) {
		switch {
		case name == "":
			return errors.New("marble: environment variable with an empty name")
		case strings.ContainsAny(name, "=\x00"):
			return fmt.Errorf("marble: environment variable %q: the name contains '=' or NUL", name)
		case slices.Contains(p.Env[name], 0):
			return fmt.Errorf("marble: environment variable %s: the value contains NUL", name)
		}
	}
	return nil
}

// Args returns the Marble's command line: a copy of Argv, or
// [DefaultArg0] if Argv is empty.
func (p *Parameters) Args() []string {
	if len(p.Argv) == 0 {
		return []string{DefaultArg0}
	}
	return slices.Clone(p.Argv)
}
