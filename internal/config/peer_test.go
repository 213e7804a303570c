package config

import (
	"bytes"
	"strings"
	"testing"
)

func TestPeerSettings(t *testing.T) {
	etcd := map[string]string{"QUARRY_STORE": "etcd", "QUARRY_ETCD_ENDPOINTS": "http://127.0.0.1:2379"}
	with := func(kv ...string) map[string]string {
		m := map[string]string{}
		for k, v := range etcd {
			m[k] = v
		}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	for _, tc := range []struct {
		name         string
		env          map[string]string
		args         []string
		listen, dial string
	}{
		{"none", etcd, nil, "", ""},
		{"listen address dialled as is", with("QUARRY_PEER_ADDR", "10.0.0.5:2003"), nil, "10.0.0.5:2003", "10.0.0.5:2003"},
		{"advertised address", with("QUARRY_PEER_ADDR", ":2003", "QUARRY_PEER_ADVERTISE_ADDR", "coordinator-1.coordinator:2003"), nil, ":2003", "coordinator-1.coordinator:2003"},
		{"flags win", with("QUARRY_PEER_ADDR", "10.0.0.5:2003"), []string{"--peer-addr", ":2004", "--peer-advertise-addr", "10.0.0.6:2004"}, ":2004", "10.0.0.6:2004"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Load(envOf(tc.env), tc.args, &bytes.Buffer{})
			if err != nil {
				t.Fatal(err)
			}
			if c.Store.PeerAddr != tc.listen || c.Store.PeerDialAddr() != tc.dial {
				t.Fatalf("listen %q dial %q, want %q %q", c.Store.PeerAddr, c.Store.PeerDialAddr(), tc.listen, tc.dial)
			}
		})
	}
}

func TestPeerInvalid(t *testing.T) {
	etcd := []string{"--store", "etcd", "--etcd-endpoints", "http://127.0.0.1:2379"}
	for _, tc := range []struct {
		name string
		env  map[string]string
		args []string
		want string
	}{
		{"bad listen address", nil, append(etcd, "--peer-addr", "nonsense"), "peer-addr [QUARRY_PEER_ADDR]"},
		{"listen address nobody can dial", nil, append(etcd, "--peer-addr", ":2003"), "set --peer-advertise-addr [QUARRY_PEER_ADVERTISE_ADDR]"},
		{"unspecified host", nil, append(etcd, "--peer-addr", "0.0.0.0:2003"), "peer-addr [QUARRY_PEER_ADDR]: other instances cannot dial it"},
		{"advertised port 0", nil, append(etcd, "--peer-addr", ":2003", "--peer-advertise-addr", "a:0"), "peer-advertise-addr [QUARRY_PEER_ADVERTISE_ADDR]"},
		{"advertised without listening", nil, append(etcd, "--peer-advertise-addr", "a:2003"), "set without --peer-addr"},
		{"peer address with the file store", map[string]string{"QUARRY_PEER_ADDR": "127.0.0.1:2003"}, nil, "etcd settings are given but the store is file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Load(envOf(tc.env), tc.args, &bytes.Buffer{})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want it to contain %q", err, tc.want)
			}
		})
	}
}
