package integration

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/quarry-cc/quarry/internal/updatelog"
)

// Operations for the checker's tests (times in arbitrary units).
func tSet(client int, call, ret int64, secret int, v string, ok bool) porcupine.Operation {
	out := mOutput{OK: ok, HTTP: 200}
	if ret == unknownReturn {
		out = mOutput{Unknown: true, HTTP: 503}
	}
	return porcupine.Operation{ClientId: client, Call: call, Return: ret, Input: mInput{Op: opSetSecret, Secret: secret, Value: v}, Output: out}
}

func tGet(client int, call, ret int64, secret int, v string) porcupine.Operation {
	return porcupine.Operation{ClientId: client, Call: call, Return: ret, Input: mInput{Op: opGetSecret, Secret: secret}, Output: mOutput{OK: true, HTTP: 200, Value: v}}
}

func tSVN(client int, call, ret int64, n int, ok bool) porcupine.Operation {
	out := mOutput{OK: ok, HTTP: 200}
	switch {
	case ret == unknownReturn:
		out = mOutput{Unknown: true, HTTP: 503}
	case !ok:
		out.HTTP = 400
	}
	return porcupine.Operation{ClientId: client, Call: call, Return: ret, Input: mInput{Op: opSetSVN, SVN: n}, Output: out}
}

func tLog(client int, call, ret int64, n int) porcupine.Operation {
	return porcupine.Operation{ClientId: client, Call: call, Return: ret, Input: mInput{Op: opGetLog}, Output: mOutput{OK: true, HTTP: 200, LogLen: n}}
}

var tManifest = porcupine.Operation{ClientId: 9, Call: 0, Return: 5, Input: mInput{Op: opSetManifest}, Output: mOutput{OK: true, HTTP: 200}}

func tEntries(spec ...string) []linLogEntry {
	out := []linLogEntry{{Update: updatelog.MsgManifestSet}}
	for _, s := range spec {
		if strings.HasPrefix(s, "svn") {
			n := 0
			for _, c := range s[3:] {
				n = n*10 + int(c-'0')
			}
			out = append(out, linLogEntry{Update: updatelog.MsgSecurityVersion, Version: n})
		} else {
			out = append(out, linLogEntry{Update: updatelog.MsgSecretSet, Secret: s})
		}
	}
	return out
}

// TestLinearizabilityLog: checkLog finds lost, doubled and refused-but-
// applied changes in the update log, and log reads that cannot be right.
func TestLinearizabilityLog(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name  string
		ops   []porcupine.Operation
		final []linLogEntry
		want  string // "" or a part of a complaint
	}{
		{"all there", []porcupine.Operation{tManifest, tSet(0, 10, 20, 0, "a", true), tSVN(1, 10, 20, 5, true), tLog(2, 30, 40, 3)},
			tEntries("userkey", "svn5"), ""},
		{"acknowledged secret lost", []porcupine.Operation{tManifest, tSet(0, 10, 20, 0, "a", true), tSet(0, 30, 40, 0, "b", true)},
			tEntries("userkey"), "fewer than"},
		{"seen unknown write lost", []porcupine.Operation{tManifest, tSet(0, 10, unknownReturn, 0, "a", false), tGet(1, 20, 30, 0, "a")},
			tEntries(), "fewer than"},
		{"unseen unknown write may be missing", []porcupine.Operation{tManifest, tSet(0, 10, unknownReturn, 0, "a", false)},
			tEntries(), ""},
		{"secret applied twice", []porcupine.Operation{tManifest, tSet(0, 10, 20, 0, "a", true)},
			tEntries("userkey", "userkey"), "applied twice"},
		{"acknowledged update lost", []porcupine.Operation{tManifest, tSVN(0, 10, 20, 5, true)},
			tEntries(), "lost"},
		{"refused update applied", []porcupine.Operation{tManifest, tSVN(0, 10, 20, 5, false)},
			tEntries("svn5"), "refused"},
		{"update applied twice", []porcupine.Operation{tManifest, tSVN(0, 10, 20, 5, true)},
			tEntries("svn5", "svn5"), "times"},
		{"downgrade applied", []porcupine.Operation{tManifest, tSVN(0, 10, 20, 9, true), tSVN(0, 30, 40, 6, true)},
			tEntries("svn9", "svn6"), "downgrade"},
		{"log read misses an acknowledged change", []porcupine.Operation{tManifest, tSet(0, 10, 20, 0, "a", true), tLog(1, 30, 40, 1)},
			tEntries("userkey"), "between 2"},
		{"log read has a change not yet sent", []porcupine.Operation{tManifest, tLog(1, 30, 40, 2), tSet(0, 50, 60, 0, "a", true)},
			tEntries("userkey"), "between 1"},
		{"log goes back", []porcupine.Operation{tManifest, tSet(0, 10, unknownReturn, 0, "a", false), tLog(1, 20, 30, 2), tLog(1, 40, 50, 1)},
			tEntries("userkey"), "went back"},
	}
	for _, tc := range cases {
		bad := checkLog(tc.ops, tc.final)
		switch {
		case tc.want == "" && len(bad) > 0:
			t.Errorf("%s: %v", tc.name, bad)
		case tc.want != "" && !strings.Contains(strings.Join(bad, "\n"), tc.want):
			t.Errorf("%s: got %v, want a complaint with %q", tc.name, bad, tc.want)
		}
	}
}

// TestLinearizabilityNarrow: narrow decides each unknown write on its own,
// and what it keeps still fails porcupine where the history is wrong.
func TestLinearizabilityNarrow(t *testing.T) {
	t.Parallel()
	// Unknown secret writes: one seen (bounded by the read), one never
	// seen (dropped); unknown updates: one in the log (bounded by the next
	// logged change), one not (dropped).
	ops := []porcupine.Operation{tManifest,
		tSet(0, 10, unknownReturn, 0, "a", false), tGet(1, 20, 30, 0, "a"),
		tSet(0, 40, unknownReturn, 0, "b", false),
		tSVN(2, 10, unknownReturn, 5, false), tSVN(3, 50, 60, 9, true),
		tSVN(2, 70, unknownReturn, 13, false),
		tLog(4, 80, 90, 4),
	}
	kept, n := narrow(ops, tEntries("userkey", "svn5", "svn9"), 100)
	if n.seen != 1 || n.unseen != 1 || n.svnApplied != 1 || n.svnNot != 1 || n.open != 0 {
		t.Errorf("narrow: %s", n)
	}
	for _, op := range kept {
		in := op.Input.(mInput)
		switch {
		case in.Op == opGetLog:
			t.Error("a log read was kept for porcupine")
		case in.Value == "b" || in.SVN == 13:
			t.Errorf("the unknown write %+v was kept", in)
		case in.Value == "a" && op.Return != 30:
			t.Errorf("the seen write returns at %d, want 30 (the read)", op.Return)
		case in.SVN == 5 && op.Return != 60:
			t.Errorf("the logged update returns at %d, want 60 (the next logged update)", op.Return)
		}
	}
	if res, _, _ := checkHistory(kept, 10*time.Second); res != porcupine.Ok {
		t.Errorf("the narrowed history is %s, want ok", res)
	}

	// A write seen and then lost stays a violation after narrowing.
	lost := []porcupine.Operation{tManifest, tSet(0, 10, unknownReturn, 0, "a", false), tGet(1, 20, 30, 0, "a"), tGet(1, 40, 50, 0, "")}
	kept, _ = narrow(lost, tEntries("userkey"), 100)
	if res, viz, _ := checkHistory(kept, 10*time.Second); res != porcupine.Illegal {
		t.Errorf("a seen write lost later: %s, want illegal", res)
	} else {
		os.Remove(viz)
	}
	// A read of a value no write sent stays a violation.
	forged := []porcupine.Operation{tManifest, tSet(0, 10, unknownReturn, 0, "a", false), tGet(1, 20, 30, 0, "z")}
	kept, _ = narrow(forged, tEntries(), 100)
	if res, viz, _ := checkHistory(kept, 10*time.Second); res != porcupine.Illegal {
		t.Errorf("a read of a value never written: %s, want illegal", res)
	} else {
		os.Remove(viz)
	}
	// An update acknowledged after a logged unknown one with a higher
	// version (so it must have been refused) is caught.
	order := []porcupine.Operation{tManifest, tSVN(0, 10, unknownReturn, 9, false), tSVN(1, 10, 20, 5, true), tSVN(1, 30, 40, 7, true)}
	kept, _ = narrow(order, tEntries("svn9", "svn5", "svn7"), 100)
	if res, viz, _ := checkHistory(kept, 10*time.Second); res != porcupine.Illegal {
		t.Errorf("updates accepted below an applied version: %s, want illegal", res)
	} else {
		os.Remove(viz)
	}
}
