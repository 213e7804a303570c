package integration

import (
	"encoding/json"
	"fmt"
	"slices"

	"github.com/anishathalye/porcupine"

	"github.com/quarry-cc/quarry/internal/updatelog"
)

// linLogEntry is one entry of the update log as the Client API returns it.
type linLogEntry struct {
	Update  string `json:"update"`
	Secret  string `json:"secret"`
	Version int    `json:"new version"`
}

// parseLog decodes the entries of GET /api/v2/update.
func parseLog(raw []string) ([]linLogEntry, error) {
	out := make([]linLogEntry, len(raw))
	for i, e := range raw {
		if err := json.Unmarshal([]byte(e), &out[i]); err != nil {
			return nil, fmt.Errorf("update log entry %d: %w: %q", i, err, e)
		}
	}
	return out, nil
}

// narrowed counts what narrow did with the writes of unknown outcome.
type narrowed struct {
	seen, unseen, svnApplied, svnNot, open int
}

func (n narrowed) String() string {
	return fmt.Sprintf("secret writes: %d seen by a read (bounded), %d never seen (dropped); package updates: %d in the final log (bounded), %d not (dropped); %d left open",
		n.seen, n.unseen, n.svnApplied, n.svnNot, n.open)
}

// narrow prepares the history for porcupine: it leaves out the update-log
// reads (checkLog checks them) and decides every write of unknown outcome
// on its own, which keeps the check fast however many there are; each step
// is sound (the history is linearizable exactly when the narrowed one is):
//
//   - a secret write whose unique value a read returned took effect before
//     that read returned: that return time bounds it;
//   - a secret write whose value no read returned is dropped: in the
//     model without the update log (modelPartition) it can always be
//     placed after every other operation, and where it was placed earlier
//     no read saw it, so removing it changes no read;
//   - a package update (every value sent is unique) took effect exactly
//     when its version is in the final update log (read after all faults
//     ended), and before the changes logged after it: the earliest return
//     of those, or of the final log read, bounds it; one whose version is
//     not in the log never took effect before that read, and is dropped.
//
// final is the final update log and finalRet the return time of its read.
func narrow(ops []porcupine.Operation, final []linLogEntry, finalRet int64) ([]porcupine.Operation, narrowed) {
	var n narrowed
	firstSeen := map[string]int64{}
	byVersion := map[int]porcupine.Operation{}
	for _, op := range ops {
		in, out := op.Input.(mInput), op.Output.(mOutput)
		if in.Op == opGetSecret && !out.Unknown && out.Value != "" {
			if r, ok := firstSeen[out.Value]; !ok || op.Return < r {
				firstSeen[out.Value] = op.Return
			}
		}
		if in.Op == opSetSVN {
			byVersion[in.SVN] = op
		}
	}
	// bound[v]: the earliest return of a change logged after version v.
	bound := map[int]int64{}
	after := finalRet
	for i := len(final) - 1; i >= 0; i-- {
		e := final[i]
		if e.Update != updatelog.MsgSecurityVersion {
			continue
		}
		bound[e.Version] = after
		if op, ok := byVersion[e.Version]; ok && op.Return < after {
			after = op.Return
		}
	}
	var kept []porcupine.Operation
	for _, op := range ops {
		in, out := op.Input.(mInput), op.Output.(mOutput)
		switch {
		case in.Op == opGetLog:
			continue
		case !out.Unknown:
		case in.Op == opSetSecret:
			r, ok := firstSeen[in.Value]
			if !ok {
				n.unseen++
				continue
			}
			op.Return = max(r, op.Call)
			n.seen++
		case in.Op == opSetSVN:
			r, ok := bound[in.SVN]
			if !ok {
				n.svnNot++
				continue
			}
			op.Return = max(r, op.Call)
			n.svnApplied++
		default:
			n.open++
		}
		kept = append(kept, op)
	}
	return kept, n
}

// checkLog checks the update log, which the porcupine model leaves out,
// and returns what is wrong:
//
//   - the final log starts with the manifest;
//   - per secret, it holds an entry for every acknowledged write and every
//     write a read saw, and no more entries than writes sent;
//   - its package versions rise, each is one a client sent and was not
//     refused, and every acknowledged update is there exactly once;
//   - every log read mid-run holds at least an entry per change
//     acknowledged before it was sent, at most one per change sent before
//     it returned, and never fewer entries than a read that ended before
//     it began.
func checkLog(ops []porcupine.Operation, final []linLogEntry) []string {
	var bad []string
	if len(final) == 0 || final[0].Update != updatelog.MsgManifestSet {
		return []string{"the final update log does not start with the manifest"}
	}
	seen := map[string]bool{}
	for _, op := range ops {
		in, out := op.Input.(mInput), op.Output.(mOutput)
		if in.Op == opGetSecret && !out.Unknown {
			seen[out.Value] = true
		}
	}
	type count struct{ low, high, got int }
	per := make([]count, len(modelSecrets))
	svnOps := map[int]mOutput{}
	for _, op := range ops {
		in, out := op.Input.(mInput), op.Output.(mOutput)
		switch in.Op {
		case opSetSecret:
			c := &per[in.Secret]
			if out.Unknown || out.OK {
				c.high++
			}
			if (!out.Unknown && out.OK) || (out.Unknown && seen[in.Value]) {
				c.low++
			}
		case opSetSVN:
			svnOps[in.SVN] = out
		}
	}
	last := modelInitialSVN
	logged := map[int]int{}
	for i, e := range final[1:] {
		switch e.Update {
		case updatelog.MsgSecretSet:
			j := slices.Index(modelSecrets[:], e.Secret)
			if j < 0 {
				bad = append(bad, fmt.Sprintf("update log entry %d names secret %q, which no client wrote", i+1, e.Secret))
				continue
			}
			per[j].got++
		case updatelog.MsgSecurityVersion:
			out, ok := svnOps[e.Version]
			switch {
			case !ok:
				bad = append(bad, fmt.Sprintf("update log entry %d: version %d, which no client sent", i+1, e.Version))
			case !out.Unknown && !out.OK:
				bad = append(bad, fmt.Sprintf("update log entry %d: version %d, whose update was refused", i+1, e.Version))
			}
			if e.Version <= last {
				bad = append(bad, fmt.Sprintf("update log entry %d: version %d after %d (a downgrade was applied)", i+1, e.Version, last))
			}
			last = max(last, e.Version)
			logged[e.Version]++
		default:
			bad = append(bad, fmt.Sprintf("update log entry %d: unexpected %q", i+1, e.Update))
		}
	}
	for v, out := range svnOps {
		if logged[v] > 1 {
			bad = append(bad, fmt.Sprintf("version %d is in the update log %d times", v, logged[v]))
		}
		if !out.Unknown && out.OK && logged[v] == 0 {
			bad = append(bad, fmt.Sprintf("the acknowledged update to version %d is not in the update log: lost", v))
		}
	}
	for i, c := range per {
		if c.got < c.low {
			bad = append(bad, fmt.Sprintf("the update log has %d entries for %s, fewer than the %d writes acknowledged or seen: lost", c.got, modelSecrets[i], c.low))
		}
		if c.got > c.high {
			bad = append(bad, fmt.Sprintf("the update log has %d entries for %s, more than the %d writes sent: applied twice", c.got, modelSecrets[i], c.high))
		}
	}

	// The log reads during the run.
	type change struct{ call, ret int64 }
	var acked, sent []change
	var reads []porcupine.Operation
	for _, op := range ops {
		in, out := op.Input.(mInput), op.Output.(mOutput)
		switch {
		case in.Op == opGetLog && !out.Unknown:
			reads = append(reads, op)
		case in.Op == opSetSecret || in.Op == opSetSVN:
			if out.Unknown || out.OK {
				sent = append(sent, change{op.Call, op.Return})
			}
			if !out.Unknown && out.OK {
				acked = append(acked, change{op.Call, op.Return})
			}
		}
	}
	for _, r := range reads {
		got := r.Output.(mOutput).LogLen
		low, high := modelLogAfterManifest, modelLogAfterManifest
		for _, c := range acked {
			if c.ret < r.Call {
				low++
			}
		}
		for _, c := range sent {
			if c.call < r.Return {
				high++
			}
		}
		if got < low || got > high {
			bad = append(bad, fmt.Sprintf("a log read (client %d, %s) returned %d entries; between %d (changes acknowledged before it) and %d (changes sent before it returned) are possible",
				r.ClientId, r.Metadata, got, low, high))
		}
		for _, p := range reads {
			if p.Return < r.Call && p.Output.(mOutput).LogLen > got {
				bad = append(bad, fmt.Sprintf("a log read (client %d, %s) returned %d entries after one that had returned %d: the log went back", r.ClientId, r.Metadata, got, p.Output.(mOutput).LogLen))
				break
			}
		}
	}
	return bad
}
