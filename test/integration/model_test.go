package integration

import (
	"fmt"
	"math"
	"os"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
)

// A sequential model of the Coordinator's Client API for porcupine: the
// part of the state the linearizability test's operations touch.

// Operation kinds of the model.
const (
	opSetManifest = "set-manifest" // POST /api/v2/manifest
	opStatus      = "status"       // GET /api/v2/status
	opSetSecret   = "set-secret"   // POST /api/v2/secrets (one secret)
	opGetSecret   = "get-secret"   // GET /api/v2/secrets?s=name
	opSetSVN      = "set-svn"      // POST /api/v2/update (package backend)
	opGetLog      = "get-log"      // GET /api/v2/update
)

// modelSecrets are the user-defined secrets the workload writes and reads.
var modelSecrets = [...]string{"userkey", "k2"}

// mInput is one operation's request.
type mInput struct {
	Op     string
	Secret int    // index into modelSecrets
	Value  string // secret value written
	SVN    int    // security version sent
}

// mOutput is its outcome. Unknown: no answer (timeout, connection error,
// 5xx): the operation may or may not have taken effect; its return time is
// infinity. Otherwise OK says the write was acknowledged (200) or refused
// (4xx), and the read fields hold what a read returned.
type mOutput struct {
	Unknown bool
	OK      bool
	HTTP    int
	Status  int
	Value   string
	LogLen  int
	// Log is the update log a log read returned (kept for the final reads).
	Log []string
}

// mState is the model's state. It is comparable, so porcupine's default
// equality (==) works. The update log is not in it: its reads are checked
// against the final log by checkLog, so that the model falls apart into
// independent parts (the package's version, each secret) that porcupine
// checks one by one (modelPartition).
type mState struct {
	Code    int // 2 ready for a manifest, 3 running
	SVN     int // SecurityVersion of package backend
	Secrets [len(modelSecrets)]string
}

// Initial values of the fixture's manifest.
const (
	modelInitialSVN = 1
	// a manifest set writes one update-log entry
	modelLogAfterManifest = 1
)

// stepModel is the sequential specification.
func stepModel(s mState, in mInput, out mOutput) (bool, mState) {
	switch in.Op {
	case opSetManifest:
		legal := s.Code == 2
		next := s
		if legal {
			next = mState{Code: 3, SVN: modelInitialSVN}
		}
		switch {
		case out.Unknown:
			return true, next
		case out.OK:
			return legal, next
		default:
			return !legal, s
		}
	case opStatus:
		return out.Status == s.Code, s
	case opSetSecret:
		legal := s.Code == 3
		next := s
		if legal {
			next.Secrets[in.Secret] = in.Value
		}
		switch {
		case out.Unknown:
			return true, next
		case out.OK:
			return legal, next
		default:
			return !legal, s
		}
	case opGetSecret:
		return out.Value == s.Secrets[in.Secret], s
	case opSetSVN:
		legal := s.Code == 3 && in.SVN >= s.SVN
		next := s
		if legal {
			next.SVN = in.SVN
		}
		switch {
		case out.Unknown:
			return true, next
		case out.OK:
			return legal, next
		default:
			return !legal, s
		}
	}
	return false, s
}

// modelPartition splits a history into parts porcupine checks on their
// own: the package's version with the status reads, and each secret. The
// manifest operations go into every part (they change everything). A
// history is linearizable exactly when every part is: the parts touch
// disjoint parts of the state, and the manifest is set once.
func modelPartition(history []porcupine.Operation) [][]porcupine.Operation {
	parts := make([][]porcupine.Operation, 1+len(modelSecrets))
	for _, op := range history {
		in := op.Input.(mInput)
		switch in.Op {
		case opSetManifest:
			for i := range parts {
				parts[i] = append(parts[i], op)
			}
		case opSetSecret, opGetSecret:
			parts[1+in.Secret] = append(parts[1+in.Secret], op)
		default:
			parts[0] = append(parts[0], op)
		}
	}
	return parts
}

// coordinatorModel is the porcupine model.
var coordinatorModel = porcupine.Model{
	Partition: modelPartition,
	Init:      func() any { return mState{Code: 2} },
	Step: func(state, input, output any) (bool, any) {
		return stepModel(state.(mState), input.(mInput), output.(mOutput))
	},
	DescribeOperation: func(input, output any) string {
		in, out := input.(mInput), output.(mOutput)
		var req string
		switch in.Op {
		case opSetSecret:
			req = fmt.Sprintf("%s(%s=%s)", in.Op, modelSecrets[in.Secret], in.Value)
		case opGetSecret:
			req = fmt.Sprintf("%s(%s)", in.Op, modelSecrets[in.Secret])
		case opSetSVN:
			req = fmt.Sprintf("%s(%d)", in.Op, in.SVN)
		default:
			req = in.Op
		}
		switch {
		case out.Unknown:
			return req + " -> unknown"
		case in.Op == opStatus:
			return fmt.Sprintf("%s -> %d", req, out.Status)
		case in.Op == opGetSecret:
			return fmt.Sprintf("%s -> %q", req, out.Value)
		case in.Op == opGetLog:
			return fmt.Sprintf("%s -> %d entries", req, out.LogLen)
		case out.OK:
			return req + " -> ok"
		default:
			return fmt.Sprintf("%s -> refused (%d)", req, out.HTTP)
		}
	},
	DescribeState: func(state any) string {
		s := state.(mState)
		return fmt.Sprintf("state %d, svn %d, secrets %q", s.Code, s.SVN, s.Secrets)
	},
}

// unknownReturn is the return time of an operation without an answer.
const unknownReturn = math.MaxInt64

// checkHistory checks ops with porcupine. On a violation (or a check that
// does not finish within timeout) it writes porcupine's HTML visualization to
// a temporary file that outlives the test and returns its path.
func checkHistory(ops []porcupine.Operation, timeout time.Duration) (porcupine.CheckResult, string, error) {
	res, info := porcupine.CheckOperationsVerbose(coordinatorModel, ops, timeout)
	if res == porcupine.Ok {
		return res, "", nil
	}
	f, err := os.CreateTemp("", "quarry-linearizability-*.html")
	if err != nil {
		return res, "", err
	}
	defer f.Close()
	if err := porcupine.Visualize(coordinatorModel, info, f); err != nil {
		return res, f.Name(), err
	}
	return res, f.Name(), nil
}

// TestLinearizabilityModel: the model accepts linearizable histories and
// rejects non-linearizable ones (so the check in TestLinearizability can
// fail), including with writes of unknown outcome; a rejection writes the
// visualization.
func TestLinearizabilityModel(t *testing.T) {
	t.Parallel()
	set := func(client int, call, ret int64, v string, ok bool) porcupine.Operation {
		out := mOutput{OK: ok, HTTP: 200}
		if ret == unknownReturn {
			out = mOutput{Unknown: true}
		}
		return porcupine.Operation{ClientId: client, Call: call, Return: ret, Input: mInput{Op: opSetSecret, Value: v}, Output: out}
	}
	get := func(client int, call, ret int64, v string) porcupine.Operation {
		return porcupine.Operation{ClientId: client, Call: call, Return: ret, Input: mInput{Op: opGetSecret}, Output: mOutput{OK: true, HTTP: 200, Value: v}}
	}
	manifest := porcupine.Operation{ClientId: 0, Call: 0, Return: 5, Input: mInput{Op: opSetManifest}, Output: mOutput{OK: true, HTTP: 200}}
	svn := func(client int, call, ret int64, n int, ok bool) porcupine.Operation {
		h := 200
		if !ok {
			h = 400
		}
		out := mOutput{OK: ok, HTTP: h}
		if ret == unknownReturn {
			out = mOutput{Unknown: true}
		}
		return porcupine.Operation{ClientId: client, Call: call, Return: ret, Input: mInput{Op: opSetSVN, SVN: n}, Output: out}
	}
	cases := []struct {
		name string
		ops  []porcupine.Operation
		want bool
	}{
		{"read your write", []porcupine.Operation{manifest, set(0, 10, 20, "a", true), get(1, 30, 40, "a")}, true},
		{"stale read after an acknowledged write", []porcupine.Operation{manifest, set(0, 10, 20, "a", true), get(1, 30, 40, "")}, false},
		{"concurrent read sees either", []porcupine.Operation{manifest, set(0, 10, 40, "a", true), get(1, 20, 30, "")}, true},
		{"read goes back in time", []porcupine.Operation{manifest, set(0, 10, 100, "a", true), get(1, 20, 30, "a"), get(2, 40, 50, "")}, false},
		{"unknown write seen late", []porcupine.Operation{manifest, set(0, 10, unknownReturn, "a", false), get(1, 20, 30, ""), get(1, 40, 50, "a")}, true},
		{"unknown write never seen", []porcupine.Operation{manifest, set(0, 10, unknownReturn, "a", false), get(1, 20, 30, "")}, true},
		{"unknown write seen then lost", []porcupine.Operation{manifest, set(0, 10, unknownReturn, "a", false), get(1, 20, 30, "a"), get(1, 40, 50, "")}, false},
		{"two manifests acknowledged", []porcupine.Operation{manifest, {ClientId: 1, Call: 1, Return: 4, Input: mInput{Op: opSetManifest}, Output: mOutput{OK: true, HTTP: 200}}}, false},
		{"downgrade refused", []porcupine.Operation{manifest, svn(0, 10, 20, 5, true), svn(1, 30, 40, 3, false)}, true},
		{"downgrade accepted", []porcupine.Operation{manifest, svn(0, 10, 20, 5, true), svn(1, 30, 40, 3, true)}, false},
		{"downgrade refused while an upgrade is unknown", []porcupine.Operation{manifest, svn(0, 10, unknownReturn, 9, false), svn(1, 30, 40, 5, false)}, true},
		{"upgrade refused with no other update", []porcupine.Operation{manifest, svn(1, 30, 40, 5, false)}, false},
	}
	for _, tc := range cases {
		res, viz, err := checkHistory(tc.ops, 10*time.Second)
		if err != nil {
			t.Fatalf("%s: writing the visualization: %v", tc.name, err)
		}
		if got := res == porcupine.Ok; got != tc.want {
			t.Errorf("%s: linearizable = %v (%s), want %v", tc.name, got, res, tc.want)
		}
		if viz != "" {
			fi, err := os.Stat(viz)
			if err != nil || fi.Size() == 0 {
				t.Errorf("%s: visualization %s: %v", tc.name, viz, err)
			}
			os.Remove(viz)
		}
	}
}
