package config

import (
	"bytes"
	"strings"
	"testing"
)

func TestMetricsSettings(t *testing.T) {
	for _, tc := range []struct {
		name        string
		env         map[string]string
		args        []string
		uuid, ready bool
	}{
		{"off by default", nil, nil, false, false},
		{"from the environment", map[string]string{"QUARRY_METRICS_MARBLE_UUID_LABEL": "1", "QUARRY_READY_IN_RECOVERY": "true"}, nil, true, true},
		{"flags alone", nil, []string{"--metrics-marble-uuid-label", "--ready-in-recovery"}, true, true},
		{"flags win", map[string]string{"QUARRY_METRICS_MARBLE_UUID_LABEL": "1", "QUARRY_READY_IN_RECOVERY": "1"},
			[]string{"--metrics-marble-uuid-label=0", "--ready-in-recovery=false"}, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Load(envOf(tc.env), tc.args, &bytes.Buffer{})
			if err != nil {
				t.Fatal(err)
			}
			if c.MetricsMarbleUUIDLabel != tc.uuid || c.ReadyInRecovery != tc.ready {
				t.Errorf("uuid label %v, ready in recovery %v; want %v, %v", c.MetricsMarbleUUIDLabel, c.ReadyInRecovery, tc.uuid, tc.ready)
			}
		})
	}
	for env, flag := range map[string]string{
		"QUARRY_METRICS_MARBLE_UUID_LABEL": "metrics-marble-uuid-label",
		"QUARRY_READY_IN_RECOVERY":         "ready-in-recovery",
	} {
		_, err := Load(envOf(map[string]string{env: "yes"}), nil, &bytes.Buffer{})
		if err == nil || !strings.Contains(err.Error(), flag+" ["+env+"]") {
			t.Errorf("%s=yes: err = %v, want one naming %s", env, err, flag)
		}
	}
}
