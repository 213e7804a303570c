package policy_test

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"strings"
	"testing"

	"github.com/quarry-cc/quarry/internal/attest/collateral"
	"github.com/quarry-cc/quarry/internal/attest/dcap"
	"github.com/quarry-cc/quarry/internal/attest/dcaptest"
	"github.com/quarry-cc/quarry/internal/attest/policy"
	"github.com/quarry-cc/quarry/internal/attest/sgxquote"
	"github.com/quarry-cc/quarry/internal/attest/tcbstatus"
	"github.com/quarry-cc/quarry/manifest"
)

const (
	mrenclave = "0102030405060708091011121314151617181920212223242526272829303132"
	mrsigner  = "a1a2a3a4a5a6a7a8a9aaabacadaeafb0b1b2b3b4b5b6b7b8b9babbbcbdbebfc0"
)

// result returns a verified result with the given status and a report with
// the IDs above, ISVPRODID 7, ISVSVN 3, no debug.
func result(t *testing.T, status tcbstatus.Status, advisories ...string) *dcap.Result {
	t.Helper()
	res := &dcap.Result{Status: status, Advisories: advisories}
	b := res.Report[:]
	if _, err := hex.Decode(b[64:96], []byte(mrenclave)); err != nil {
		t.Fatal(err)
	}
	if _, err := hex.Decode(b[128:160], []byte(mrsigner)); err != nil {
		t.Fatal(err)
	}
	binary.LittleEndian.PutUint16(b[256:], 7)
	binary.LittleEndian.PutUint16(b[258:], 3)
	copy(b[320:], "report data")
	return res
}

func u64(v uint64) *uint64 { return &v }
func ui(v uint) *uint      { return &v }

func TestTCBStatus(t *testing.T) {
	for _, tc := range []struct {
		name     string
		status   tcbstatus.Status
		accepted []string
		ok       bool
	}{
		{"UpToDate, default", tcbstatus.UpToDate, nil, true},
		{"UpToDate, not listed", tcbstatus.UpToDate, []string{"OutOfDate"}, true},
		{"SWHardeningNeeded, default", tcbstatus.SWHardeningNeeded, nil, true},
		{"SWHardeningNeeded, not listed", tcbstatus.SWHardeningNeeded, []string{"OutOfDate"}, false},
		{"OutOfDate, default", tcbstatus.OutOfDate, nil, false},
		{"OutOfDate, listed", tcbstatus.OutOfDate, []string{"OutOfDate"}, true},
		{"OutOfDate, listed in other case", tcbstatus.OutOfDate, []string{"outofdate"}, true},
		{"ConfigurationNeeded, default", tcbstatus.ConfigurationNeeded, nil, false},
		{"ConfigurationAndSWHardeningNeeded, listed", tcbstatus.ConfigurationAndSWHardeningNeeded, []string{"SWHardeningNeeded", "ConfigurationAndSWHardeningNeeded"}, true},
		{"ConfigurationAndSWHardeningNeeded, only SW listed", tcbstatus.ConfigurationAndSWHardeningNeeded, []string{"SWHardeningNeeded"}, false},
		{"OutOfDateConfigurationNeeded, listed", tcbstatus.OutOfDateConfigurationNeeded, []string{"OutOfDateConfigurationNeeded"}, true},
		{"Revoked, default", tcbstatus.Revoked, nil, false},
		{"Revoked, listed", tcbstatus.Revoked, []string{"Revoked"}, true},
		{"Unknown, listed", tcbstatus.Unknown, []string{"Unknown"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := policy.Check(result(t, tc.status), manifest.Package{AcceptedTCBStatuses: tc.accepted})
			if tc.ok && err != nil {
				t.Fatalf("rejected: %v", err)
			}
			if !tc.ok && !errors.Is(err, policy.ErrTCBStatus) {
				t.Fatalf("err = %v, want ErrTCBStatus", err)
			}
		})
	}
}

func TestAdvisories(t *testing.T) {
	for _, tc := range []struct {
		name       string
		status     tcbstatus.Status
		advisories []string
		accepted   []string
		statuses   []string
		ok         bool
	}{
		{"empty list accepts all", tcbstatus.SWHardeningNeeded, []string{"INTEL-SA-00615"}, nil, nil, true},
		{"all listed", tcbstatus.SWHardeningNeeded, []string{"INTEL-SA-00615", "INTEL-SA-00289"}, []string{"INTEL-SA-00289", "INTEL-SA-00615"}, nil, true},
		{"listed in other case", tcbstatus.SWHardeningNeeded, []string{"INTEL-SA-00615"}, []string{"intel-sa-00615"}, nil, true},
		{"one missing", tcbstatus.SWHardeningNeeded, []string{"INTEL-SA-00615", "INTEL-SA-00289"}, []string{"INTEL-SA-00615"}, nil, false},
		{"no advisories", tcbstatus.SWHardeningNeeded, nil, []string{"INTEL-SA-00615"}, nil, true},
		{"not checked for other statuses", tcbstatus.ConfigurationAndSWHardeningNeeded, []string{"INTEL-SA-00289"}, []string{"INTEL-SA-00615"}, []string{"ConfigurationAndSWHardeningNeeded"}, true},
		{"not checked for UpToDate", tcbstatus.UpToDate, []string{"INTEL-SA-00289"}, []string{"INTEL-SA-00615"}, nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := policy.Check(result(t, tc.status, tc.advisories...), manifest.Package{AcceptedAdvisories: tc.accepted, AcceptedTCBStatuses: tc.statuses})
			if tc.ok && err != nil {
				t.Fatalf("rejected: %v", err)
			}
			if !tc.ok && (!errors.Is(err, policy.ErrAdvisory) || !strings.Contains(err.Error(), "INTEL-SA-00289")) {
				t.Fatalf("err = %v, want ErrAdvisory naming INTEL-SA-00289", err)
			}
		})
	}
}

func TestPackageProperties(t *testing.T) {
	debugResult := func(t *testing.T) *dcap.Result {
		res := result(t, tcbstatus.UpToDate)
		res.Report[48] |= sgxquote.AttributeDebug
		return res
	}
	for _, tc := range []struct {
		name string
		res  func(t *testing.T) *dcap.Result
		pkg  manifest.Package
		want error
	}{
		{"empty package", nil, manifest.Package{}, nil},
		{"all set", nil, manifest.Package{UniqueID: mrenclave, SignerID: mrsigner, ProductID: u64(7), SecurityVersion: ui(3)}, nil},
		{"IDs in upper case", nil, manifest.Package{UniqueID: strings.ToUpper(mrenclave), SignerID: strings.ToUpper(mrsigner)}, nil},
		{"debug enclave, production package", debugResult, manifest.Package{}, policy.ErrDebug},
		{"production enclave, debug package", nil, manifest.Package{Debug: true}, policy.ErrDebug},
		{"debug enclave, debug package", debugResult, manifest.Package{Debug: true}, nil},
		{"wrong UniqueID", nil, manifest.Package{UniqueID: mrsigner}, policy.ErrUniqueID},
		{"UniqueID prefix", nil, manifest.Package{UniqueID: mrenclave[:32]}, policy.ErrUniqueID},
		{"wrong SignerID", nil, manifest.Package{SignerID: mrenclave}, policy.ErrSignerID},
		{"ProductID differs", nil, manifest.Package{ProductID: u64(8)}, policy.ErrProductID},
		{"ProductID 0 is set", nil, manifest.Package{ProductID: u64(0)}, policy.ErrProductID},
		{"ProductID beyond 16 bits", nil, manifest.Package{ProductID: u64(7 + 1<<16)}, policy.ErrProductID},
		{"SecurityVersion equal", nil, manifest.Package{SecurityVersion: ui(3)}, nil},
		{"SecurityVersion lower", nil, manifest.Package{SecurityVersion: ui(0)}, nil},
		{"SecurityVersion higher", nil, manifest.Package{SecurityVersion: ui(4)}, policy.ErrSecurityVersion},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := result(t, tcbstatus.UpToDate)
			if tc.res != nil {
				res = tc.res(t)
			}
			if err := policy.Check(res, tc.pkg); !errors.Is(err, tc.want) || (tc.want == nil && err != nil) {
				t.Fatalf("Check = %v, want %v", err, tc.want)
			}
		})
	}
}

func TestReportData(t *testing.T) {
	res := result(t, tcbstatus.UpToDate)
	for _, tc := range []struct {
		name string
		want []byte
		ok   bool
	}{
		{"prefix", []byte("report"), true},
		{"whole text", []byte("report data"), true},
		{"64 bytes", append([]byte("report data"), make([]byte, 53)...), true},
		{"differs", []byte("report dat4"), false},
		{"empty", nil, false},
		{"65 bytes", make([]byte, 65), false},
	} {
		err := policy.CheckReportData(res, tc.want)
		if tc.ok != (err == nil) || (err != nil && !errors.Is(err, policy.ErrReportData)) {
			t.Errorf("%s: err = %v", tc.name, err)
		}
	}
}

// TestPhala applies the rules to the real vector's verified result.
func TestPhala(t *testing.T) {
	quote, col := dcaptest.Phala(t)
	res, err := (&dcap.Verifier{Collateral: collateral.Static{Collateral: col}, Now: dcaptest.PhalaTime}).Verify(context.Background(), quote)
	if err != nil {
		t.Fatal(err)
	}
	mr := res.Report.MRENCLAVE()
	pkg := manifest.Package{UniqueID: hex.EncodeToString(mr[:]), ProductID: u64(0), SecurityVersion: ui(0)}
	if err := policy.Check(res, pkg); !errors.Is(err, policy.ErrTCBStatus) {
		t.Errorf("default statuses: err = %v, want ErrTCBStatus", err)
	}
	pkg.AcceptedTCBStatuses = []string{"ConfigurationAndSWHardeningNeeded"}
	if err := policy.Check(res, pkg); err != nil {
		t.Errorf("accepted status: %v", err)
	}
	if err := policy.CheckReportData(res, []byte("Hello, world!")); err != nil {
		t.Error(err)
	}
}
