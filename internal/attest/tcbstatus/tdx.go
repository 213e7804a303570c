package tcbstatus

// ConvergeModule merges the TDX module's TCB status into the platform's
// (Intel QVL, TDX module check): an out-of-date module turns UpToDate and
// SWHardeningNeeded into OutOfDate and the two configuration statuses into
// OutOfDateConfigurationNeeded; a revoked module gives Revoked; otherwise the
// platform status stands.
func ConvergeModule(platform, module Status) Status {
	// The rule is the same as for the quoting enclave.
	return Converge(platform, module)
}

// NeedsConfiguration reports whether s asks for platform configuration.
func (s Status) NeedsConfiguration() bool {
	switch s {
	case ConfigurationNeeded, ConfigurationAndSWHardeningNeeded, OutOfDateConfigurationNeeded, TDRelaunchAdvisedConfigurationNeeded:
		return true
	}
	return false
}
