package config

import (
	"bytes"
	"strings"
	"testing"
)

func TestMeshSettings(t *testing.T) {
	c, err := Load(envOf(map[string]string{"QUARRY_MESH_MAX_CONNECTIONS": "1000", "QUARRY_MESH_MAX_CONNECTIONS_PER_SOURCE": "8"}), nil, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if c.Mesh != (MeshConfig{MaxConnections: 1000, MaxConnectionsPerSource: 8}) {
		t.Fatalf("from the environment: %+v", c.Mesh)
	}
	c, err = Load(envOf(map[string]string{"QUARRY_MESH_MAX_CONNECTIONS": "1000"}),
		[]string{"--mesh-max-connections", "64", "--mesh-max-connections-per-source", "64"}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if c.Mesh != (MeshConfig{MaxConnections: 64, MaxConnectionsPerSource: 64}) {
		t.Fatalf("flags: %+v", c.Mesh)
	}
	for _, tc := range []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{"QUARRY_MESH_MAX_CONNECTIONS": "0"}, "mesh-max-connections [QUARRY_MESH_MAX_CONNECTIONS]: \"0\" is not a count between 1 and 65536"},
		{map[string]string{"QUARRY_MESH_MAX_CONNECTIONS": "lots"}, "mesh-max-connections [QUARRY_MESH_MAX_CONNECTIONS]"},
		{map[string]string{"QUARRY_MESH_MAX_CONNECTIONS_PER_SOURCE": "-1"}, "mesh-max-connections-per-source [QUARRY_MESH_MAX_CONNECTIONS_PER_SOURCE]: \"-1\""},
		{map[string]string{"QUARRY_MESH_MAX_CONNECTIONS": "10", "QUARRY_MESH_MAX_CONNECTIONS_PER_SOURCE": "11"},
			"mesh-max-connections-per-source [QUARRY_MESH_MAX_CONNECTIONS_PER_SOURCE]: 11 is more than mesh-max-connections (10)"},
	} {
		_, err := Load(envOf(tc.env), nil, &bytes.Buffer{})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want %q", tc.env, err, tc.want)
		}
	}
	var help bytes.Buffer
	Load(envOf(nil), []string{"--help"}, &help)
	for _, want := range []string{"-mesh-max-connections", "QUARRY_MESH_MAX_CONNECTIONS]", "-mesh-max-connections-per-source", "QUARRY_MESH_MAX_CONNECTIONS_PER_SOURCE]"} {
		if !strings.Contains(help.String(), want) {
			t.Errorf("--help does not mention %s", want)
		}
	}
}
