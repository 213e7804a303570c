package tcbstatus

import (
	"errors"
	"testing"
)

func TestOrderAndStrings(t *testing.T) {
	// EGo's numeric values and Intel's strings.
	for _, tc := range []struct {
		s    Status
		num  uint
		name string
	}{
		{UpToDate, 0, "UpToDate"},
		{OutOfDate, 1, "OutOfDate"},
		{Revoked, 2, "Revoked"},
		{ConfigurationNeeded, 3, "ConfigurationNeeded"},
		{OutOfDateConfigurationNeeded, 4, "OutOfDateConfigurationNeeded"},
		{SWHardeningNeeded, 5, "SWHardeningNeeded"},
		{ConfigurationAndSWHardeningNeeded, 6, "ConfigurationAndSWHardeningNeeded"},
		{Unknown, 7, "Unknown"},
		{Status(99), 99, "Unknown"},
	} {
		if uint(tc.s) != tc.num {
			t.Errorf("%s = %d, want %d", tc.name, uint(tc.s), tc.num)
		}
		if got := tc.s.String(); got != tc.name {
			t.Errorf("Status(%d).String() = %q, want %q", tc.num, got, tc.name)
		}
		if tc.s.Explain() == "" {
			t.Errorf("Status(%d).Explain() is empty", tc.num)
		}
	}
}

func TestParse(t *testing.T) {
	for s := UpToDate; s < Unknown; s++ {
		got, err := Parse(s.String())
		if err != nil || got != s {
			t.Errorf("Parse(%q) = %v, %v; want %v", s.String(), got, err, s)
		}
	}
	for _, bad := range []string{"", "Unknown", "uptodate", "TDRelaunchAdvised", "UpToDate "} {
		if got, err := Parse(bad); !errors.Is(err, ErrUnknown) || got != Unknown {
			t.Errorf("Parse(%q) = %v, %v; want Unknown, ErrUnknown", bad, got, err)
		}
	}
}

func TestText(t *testing.T) {
	for s := UpToDate; s <= Unknown; s++ {
		b, err := s.MarshalText()
		if err != nil {
			t.Fatal(err)
		}
		var back Status
		if err := back.UnmarshalText(b); err != nil || back != s {
			t.Errorf("round trip of %v = %v, %v", s, back, err)
		}
	}
	var s Status
	if err := s.UnmarshalText([]byte("nonsense")); !errors.Is(err, ErrUnknown) {
		t.Errorf("UnmarshalText(nonsense) = %v, want ErrUnknown", err)
	}
}

func TestConverge(t *testing.T) {
	for _, tc := range []struct {
		platform, qe, want Status
	}{
		{UpToDate, UpToDate, UpToDate},
		{SWHardeningNeeded, UpToDate, SWHardeningNeeded},
		{ConfigurationNeeded, UpToDate, ConfigurationNeeded},
		{ConfigurationAndSWHardeningNeeded, UpToDate, ConfigurationAndSWHardeningNeeded},
		{OutOfDate, UpToDate, OutOfDate},
		{OutOfDateConfigurationNeeded, UpToDate, OutOfDateConfigurationNeeded},
		{Revoked, UpToDate, Revoked},

		{UpToDate, OutOfDate, OutOfDate},
		{SWHardeningNeeded, OutOfDate, OutOfDate},
		{ConfigurationNeeded, OutOfDate, OutOfDateConfigurationNeeded},
		{ConfigurationAndSWHardeningNeeded, OutOfDate, OutOfDateConfigurationNeeded},
		{OutOfDate, OutOfDate, OutOfDate},
		{OutOfDateConfigurationNeeded, OutOfDate, OutOfDateConfigurationNeeded},
		{Revoked, OutOfDate, Revoked},

		{UpToDate, Revoked, Revoked},
		{SWHardeningNeeded, Revoked, Revoked},
		{ConfigurationAndSWHardeningNeeded, Revoked, Revoked},
		{OutOfDate, Revoked, Revoked},
	} {
		if got := Converge(tc.platform, tc.qe); got != tc.want {
			t.Errorf("Converge(%v, %v) = %v, want %v", tc.platform, tc.qe, got, tc.want)
		}
	}
}
