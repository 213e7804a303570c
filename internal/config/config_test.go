package config

import (
	"bytes"
	"errors"
	"log/slog"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

func envOf(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

func TestDefaults(t *testing.T) {
	c, err := Load(envOf(nil), nil, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	want := Config{
		ClientAddr:        ":4433",
		MeshAddr:          ":2001",
		DNSNames:          []string{"localhost"},
		SealDir:           filepath.Join(".", "marblerun-coordinator-data"),
		HTTPErrorLogLevel: slog.LevelError,
		MaxManifestBytes:  8 << 20,
		RecoveryTimeout:   30 * time.Minute,
	}
	if !reflect.DeepEqual(c, want) {
		t.Fatalf("defaults = %+v\nwant %+v", c, want)
	}
}

func TestEnvironmentAndFlags(t *testing.T) {
	env := envOf(map[string]string{
		"EDG_COORDINATOR_CLIENT_ADDR": "127.0.0.1:9000",
		"EDG_COORDINATOR_MESH_ADDR":   "127.0.0.1:9001",
		"EDG_COORDINATOR_DNS_NAMES":   "coordinator.example, 10.0.0.1",
		"EDG_CWD":                     "/srv",
		"EDG_DEBUG_LOGGING":           "1",
		"EDG_HTTP_ERROR_LOG_LEVEL":    "warn",
		"EDG_STARTUP_MANIFEST":        "/m.json",
		"QUARRY_MAX_MANIFEST_SIZE":    "4096",
	})
	c, err := Load(env, []string{"--mesh-addr", "127.0.0.1:9999"}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if c.ClientAddr != "127.0.0.1:9000" || c.MeshAddr != "127.0.0.1:9999" {
		t.Errorf("addresses = %q %q (flag must win over env)", c.ClientAddr, c.MeshAddr)
	}
	if c.SealDir != "/srv/marblerun-coordinator-data" {
		t.Errorf("seal dir under EDG_CWD = %q", c.SealDir)
	}
	if !c.DebugLogging || c.HTTPErrorLogLevel != slog.LevelWarn || c.StartupManifest != "/m.json" || c.MaxManifestBytes != 4096 {
		t.Errorf("config = %+v", c)
	}
	dns, ips := c.SplitNames()
	if !reflect.DeepEqual(dns, []string{"coordinator.example"}) || len(ips) != 1 || ips[0].String() != "10.0.0.1" {
		t.Errorf("SplitNames = %v %v", dns, ips)
	}
}

func TestInvalid(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  map[string]string
		args []string
		want string
	}{
		{"bad client addr", map[string]string{"EDG_COORDINATOR_CLIENT_ADDR": "4433"}, nil, "client-addr [EDG_COORDINATOR_CLIENT_ADDR]"},
		{"bad port", nil, []string{"--mesh-addr", ":99999"}, "mesh-addr"},
		{"bad prometheus", map[string]string{"EDG_COORDINATOR_PROMETHEUS_ADDR": "x"}, nil, "prometheus-addr"},
		{"bad dns name", map[string]string{"EDG_COORDINATOR_DNS_NAMES": "ok,bad name"}, nil, `"bad name" is neither`},
		{"empty dns entry", map[string]string{"EDG_COORDINATOR_DNS_NAMES": "a,,b"}, nil, `"" is neither`},
		{"bad bool", map[string]string{"EDG_DEBUG_LOGGING": "yes"}, nil, "debug [EDG_DEBUG_LOGGING]"},
		{"bad level", map[string]string{"EDG_HTTP_ERROR_LOG_LEVEL": "loud"}, nil, "http-error-log-level"},
		{"bad timeout", map[string]string{"QUARRY_RECOVERY_TIMEOUT": "soon"}, nil, "recovery-timeout"},
		{"bad size", nil, []string{"--max-manifest-size", "12"}, "max-manifest-size"},
		{"unknown flag", nil, []string{"--nope"}, "flag provided but not defined"},
		{"argument", nil, []string{"extra"}, "unexpected argument"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Load(envOf(tc.env), tc.args, &bytes.Buffer{})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want it to contain %q", err, tc.want)
			}
		})
	}
}

func TestHelp(t *testing.T) {
	var out bytes.Buffer
	_, err := Load(envOf(nil), []string{"--help"}, &out)
	if !errors.Is(err, ErrHelp) {
		t.Fatalf("err = %v, want ErrHelp", err)
	}
	for _, want := range []string{"EDG_COORDINATOR_CLIENT_ADDR", "EDG_COORDINATOR_MESH_ADDR", "EDG_COORDINATOR_DNS_NAMES",
		"EDG_COORDINATOR_SEAL_DIR", "EDG_DEBUG_LOGGING", "EDG_STARTUP_MANIFEST", "-client-addr", "-seal-dir"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("help does not mention %s", want)
		}
	}
}
