// Package tcbstatus names the TCB status of an SGX platform as reported by
// DCAP quote verification. The numeric order matches EGo's and MarbleRun's
// (UpToDate = 0 … Unknown = 7) and String returns Intel's status strings.
package tcbstatus

import (
	"errors"
	"fmt"
)

// Status is the TCB status of a platform or quoting enclave.
type Status uint

// The statuses in EGo's numeric order.
const (
	UpToDate Status = iota
	OutOfDate
	Revoked
	ConfigurationNeeded
	OutOfDateConfigurationNeeded
	SWHardeningNeeded
	ConfigurationAndSWHardeningNeeded
	Unknown
	// TDX only (Intel QVL, TD 1.5 relaunch check); numbered after Unknown
	// to keep EGo's order.
	TDRelaunchAdvised
	TDRelaunchAdvisedConfigurationNeeded
	maxStatus
)

// ErrUnknown is returned by Parse for a string that is not one of Intel's
// SGX TCB status strings.
var ErrUnknown = errors.New("tcbstatus: unknown TCB status")

var names = [...]string{
	UpToDate:                             "UpToDate",
	OutOfDate:                            "OutOfDate",
	Revoked:                              "Revoked",
	ConfigurationNeeded:                  "ConfigurationNeeded",
	OutOfDateConfigurationNeeded:         "OutOfDateConfigurationNeeded",
	SWHardeningNeeded:                    "SWHardeningNeeded",
	ConfigurationAndSWHardeningNeeded:    "ConfigurationAndSWHardeningNeeded",
	Unknown:                              "Unknown",
	TDRelaunchAdvised:                    "TDRelaunchAdvised",
	TDRelaunchAdvisedConfigurationNeeded: "TDRelaunchAdvisedConfigurationNeeded",
}

var explanations = [...]string{
	UpToDate:                             "The platform is patched to the latest TCB level.",
	OutOfDate:                            "The platform's TCB level is out of date: a newer level exists that fixes known vulnerabilities.",
	Revoked:                              "The platform's TCB level or its quoting enclave has been revoked and must not be trusted.",
	ConfigurationNeeded:                  "The TCB level is current, but the platform needs additional configuration (for example BIOS settings) to be fully protected.",
	OutOfDateConfigurationNeeded:         "The TCB level is out of date and the platform also needs additional configuration.",
	SWHardeningNeeded:                    "The TCB level is current, but some vulnerabilities can only be mitigated by software hardening in the enclave; see the advisories.",
	ConfigurationAndSWHardeningNeeded:    "The TCB level is current, but the platform needs additional configuration and the enclave needs software hardening; see the advisories.",
	Unknown:                              "The TCB status is unknown.",
	TDRelaunchAdvised:                    "The TDX platform was updated while the TD ran; relaunching the TD brings it to the current TCB level.",
	TDRelaunchAdvisedConfigurationNeeded: "The TDX platform was updated while the TD ran and needs additional configuration; relaunching the TD brings it to the current TCB level.",
}

// String returns Intel's status string, or "Unknown" for values out of range.
func (s Status) String() string {
	if s < maxStatus {
		return names[s]
	}
	return names[Unknown]
}

// Explain describes what the status means for a relying party.
func (s Status) Explain() string {
	if s < maxStatus {
		return explanations[s]
	}
	return explanations[Unknown]
}

// Parse returns the Status named by Intel's string s (case-sensitive, as
// Intel's collateral and MarbleRun's SDK spell them). "Unknown" and any other
// string give ErrUnknown.
func Parse(s string) (Status, error) {
	for i, n := range names[:Unknown] {
		if n == s {
			return Status(i), nil
		}
	}
	return Unknown, fmt.Errorf("%w: %q", ErrUnknown, s)
}

// MarshalText encodes the status as its Intel string.
func (s Status) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// UnmarshalText decodes an Intel status string, including "Unknown" and the
// two TDX relaunch statuses that Parse (TCB info strings only) rejects.
func (s *Status) UnmarshalText(b []byte) error {
	for _, v := range []Status{Unknown, TDRelaunchAdvised, TDRelaunchAdvisedConfigurationNeeded} {
		if string(b) == names[v] {
			*s = v
			return nil
		}
	}
	v, err := Parse(string(b))
	if err != nil {
		return err
	}
	*s = v
	return nil
}

// Converge combines the platform's TCB status with the quoting enclave's
// status by Intel's rule (QVL convergeTcbStatusWithQeTcbStatus): a revoked QE
// makes the result Revoked; an out-of-date QE turns UpToDate and
// SWHardeningNeeded into OutOfDate and the two configuration statuses into
// OutOfDateConfigurationNeeded; otherwise the platform status stands.
func Converge(platform, qe Status) Status {
	switch qe {
	case Revoked:
		return Revoked
	case OutOfDate:
		switch platform {
		case UpToDate, SWHardeningNeeded:
			return OutOfDate
		case ConfigurationNeeded, ConfigurationAndSWHardeningNeeded:
			return OutOfDateConfigurationNeeded
		}
	}
	return platform
}
