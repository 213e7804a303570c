package config

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

func TestClientLimits(t *testing.T) {
	c, err := Load(envOf(map[string]string{
		"QUARRY_CLIENT_MAX_CONNS":      "500",
		"QUARRY_CLIENT_MAX_PER_SOURCE": "auto",
		"QUARRY_CLIENT_MIN_BODY_RATE":  "0",
	}), []string{"--client-body-grace", "1s", "--client-max-per-source=7"}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if want := (ClientLimits{MaxConns: 500, MaxPerSource: 7, MinBodyRate: 0, BodyGrace: time.Second}); c.Client != want {
		t.Fatalf("client limits %+v, want %+v", c.Client, want)
	}
	for _, tc := range []struct{ env, value, names string }{
		{"QUARRY_CLIENT_MAX_CONNS", "0", "client-max-conns [QUARRY_CLIENT_MAX_CONNS]"},
		{"QUARRY_CLIENT_MAX_CONNS", "many", "client-max-conns [QUARRY_CLIENT_MAX_CONNS]"},
		{"QUARRY_CLIENT_MAX_PER_SOURCE", "-1", "client-max-per-source [QUARRY_CLIENT_MAX_PER_SOURCE]"},
		{"QUARRY_CLIENT_MIN_BODY_RATE", "fast", "client-min-body-rate [QUARRY_CLIENT_MIN_BODY_RATE]"},
		{"QUARRY_CLIENT_BODY_GRACE", "1h", "client-body-grace [QUARRY_CLIENT_BODY_GRACE]"},
	} {
		_, err := Load(envOf(map[string]string{tc.env: tc.value}), nil, &bytes.Buffer{})
		if err == nil || !strings.Contains(err.Error(), tc.names) || !strings.Contains(err.Error(), tc.value) {
			t.Errorf("%s=%s: %v", tc.env, tc.value, err)
		}
	}
	var help bytes.Buffer
	Load(envOf(nil), []string{"--help"}, &help)
	for _, want := range []string{"QUARRY_CLIENT_MAX_CONNS", "QUARRY_CLIENT_MAX_PER_SOURCE", "QUARRY_CLIENT_MIN_BODY_RATE", "QUARRY_CLIENT_BODY_GRACE", "RLIMIT_NOFILE"} {
		if !strings.Contains(help.String(), want) {
			t.Errorf("--help does not mention %s", want)
		}
	}
}
