package config

import (
	"bytes"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestStoreSettings(t *testing.T) {
	dir := t.TempDir()
	ca, cert, key := filepath.Join(dir, "ca.pem"), filepath.Join(dir, "c.pem"), filepath.Join(dir, "k.pem")
	for _, f := range []string{ca, cert, key} {
		if err := os.WriteFile(f, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name string
		env  map[string]string
		args []string
		want StoreConfig
	}{
		{"default", nil, nil, StoreConfig{Kind: "file", EtcdPrefix: "/quarry/", Timeout: 2 * time.Second, Compaction: true, CompactionRetention: 30 * time.Second}},
		{"environment", map[string]string{
			"QUARRY_STORE":                     "etcd",
			"QUARRY_ETCD_ENDPOINTS":            "http://127.0.0.1:2379, https://etcd-1:2379/",
			"QUARRY_ETCD_PREFIX":               "/prod/",
			"QUARRY_ETCD_CA":                   ca,
			"QUARRY_ETCD_CERT":                 cert,
			"QUARRY_ETCD_KEY":                  key,
			"QUARRY_INSECURE_PEER_TRUST":       "1",
			"QUARRY_STORE_TIMEOUT":             "750ms",
			"QUARRY_ETCD_COMPACTION":           "0",
			"QUARRY_ETCD_COMPACTION_RETENTION": "10m",
		}, nil, StoreConfig{Kind: "etcd", EtcdEndpoints: []string{"http://127.0.0.1:2379", "https://etcd-1:2379/"},
			EtcdPrefix: "/prod/", EtcdCA: ca, EtcdCert: cert, EtcdKey: key, InsecurePeerTrust: true, Timeout: 750 * time.Millisecond,
			CompactionRetention: 10 * time.Minute}},
		{"flags win", map[string]string{"QUARRY_STORE": "file", "QUARRY_ETCD_PREFIX": "/env/", "QUARRY_ETCD_COMPACTION": "1"},
			[]string{"--store", "ETCD", "--etcd-endpoints", "http://a:1", "--etcd-prefix", "/flag/", "--insecure-peer-trust", "--store-timeout", "5s",
				"--etcd-compaction=0", "--etcd-compaction-retention", "1h"},
			StoreConfig{Kind: "etcd", EtcdEndpoints: []string{"http://a:1"}, EtcdPrefix: "/flag/", InsecurePeerTrust: true, Timeout: 5 * time.Second,
				CompactionRetention: time.Hour}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Load(envOf(tc.env), tc.args, &bytes.Buffer{})
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(c.Store, tc.want) {
				t.Errorf("Store = %+v\nwant %+v", c.Store, tc.want)
			}
		})
	}
}

func TestStoreInvalid(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "c.pem")
	if err := os.WriteFile(file, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	etcd := []string{"--store", "etcd", "--etcd-endpoints", "http://127.0.0.1:2379"}
	for _, tc := range []struct {
		name string
		env  map[string]string
		args []string
		want string
	}{
		{"unknown store", map[string]string{"QUARRY_STORE": "consul"}, nil, `store [QUARRY_STORE]: "consul" is not one of file, etcd`},
		{"etcd without endpoints", nil, []string{"--store", "etcd"}, "etcd-endpoints [QUARRY_ETCD_ENDPOINTS]: store etcd needs"},
		{"endpoint without scheme", nil, []string{"--store", "etcd", "--etcd-endpoints", "127.0.0.1:2379"}, "etcd-endpoints [QUARRY_ETCD_ENDPOINTS]"},
		{"endpoint without port", map[string]string{"QUARRY_STORE": "etcd", "QUARRY_ETCD_ENDPOINTS": "http://etcd"}, nil, "needs a port"},
		{"endpoint with path", nil, []string{"--store", "etcd", "--etcd-endpoints", "http://a:1/x"}, "etcd-endpoints"},
		{"ftp endpoint", nil, []string{"--store", "etcd", "--etcd-endpoints", "http://a:1,ftp://b:2"}, `"ftp://b:2"`},
		{"relative prefix", nil, append(etcd, "--etcd-prefix", "quarry/"), "etcd-prefix [QUARRY_ETCD_PREFIX]"},
		{"empty prefix", map[string]string{"QUARRY_ETCD_PREFIX": ""}, append(etcd, "--etcd-prefix", ""), "etcd-prefix"},
		{"missing ca", nil, append(etcd, "--etcd-ca", "/nonexistent/ca.pem"), "etcd-ca [QUARRY_ETCD_CA]"},
		{"ca is a directory", map[string]string{"QUARRY_ETCD_CA": dir}, etcd, "etcd-ca [QUARRY_ETCD_CA]"},
		{"cert without key", nil, append(etcd, "--etcd-cert", file), "etcd-cert [QUARRY_ETCD_CERT] and etcd-key [QUARRY_ETCD_KEY] go together"},
		{"missing key", map[string]string{"QUARRY_ETCD_CERT": file, "QUARRY_ETCD_KEY": "/nonexistent/k.pem"}, etcd, "etcd-key [QUARRY_ETCD_KEY]"},
		{"compaction not a switch", nil, append(etcd, "--etcd-compaction=maybe"), "etcd-compaction [QUARRY_ETCD_COMPACTION]"},
		{"retention below the least", nil, append(etcd, "--etcd-compaction-retention", "5s"), "etcd-compaction-retention [QUARRY_ETCD_COMPACTION_RETENTION]: \"5s\" is not a duration between 10s and 24h"},
		{"retention too short for a lost write's read-back", nil, append(etcd, "--store-timeout", "10s", "--etcd-compaction-retention", "30s"), "shorter than 5 store timeouts (--store-timeout 10s)"},
		{"retention not a duration", map[string]string{"QUARRY_ETCD_COMPACTION_RETENTION": "5"}, etcd, "etcd-compaction-retention [QUARRY_ETCD_COMPACTION_RETENTION]"},
		{"etcd settings with the file store", map[string]string{"QUARRY_ETCD_ENDPOINTS": "http://a:1"}, nil, "etcd settings are given but the store is file"},
		{"bad peer trust switch", map[string]string{"QUARRY_INSECURE_PEER_TRUST": "yes"}, nil, "insecure-peer-trust [QUARRY_INSECURE_PEER_TRUST]"},
		{"store timeout not a duration", map[string]string{"QUARRY_STORE_TIMEOUT": "2"}, etcd, "store-timeout [QUARRY_STORE_TIMEOUT]"},
		{"store timeout too short", nil, append(etcd, "--store-timeout", "10ms"), "between 100ms and 1m"},
		{"store timeout too long", nil, append(etcd, "--store-timeout", "2m"), "between 100ms and 1m"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Load(envOf(tc.env), tc.args, &bytes.Buffer{})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want it to contain %q", err, tc.want)
			}
		})
	}
}
