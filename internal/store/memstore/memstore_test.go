package memstore

import (
	"testing"

	"github.com/quarry-cc/quarry/internal/store"
	"github.com/quarry-cc/quarry/internal/store/storetest"
)

func TestConformance(t *testing.T) {
	storetest.Run(t, func(*testing.T) store.Store { return New() })
}

func TestMoveAsideKeepsEveryBlob(t *testing.T) {
	s := New()
	ctx := t.Context()
	var wheres []string
	for _, content := range []string{"first", "second", "third"} {
		if _, err := s.Save(ctx, []byte(content), ""); err != nil {
			t.Fatal(err)
		}
		where, err := s.MoveAside(ctx, "corrupt")
		if err != nil {
			t.Fatal(err)
		}
		wheres = append(wheres, where)
	}
	want := []string{"memory:corrupt", "memory:corrupt.1", "memory:corrupt.2"}
	for i, content := range []string{"first", "second", "third"} {
		if wheres[i] != want[i] {
			t.Errorf("MoveAside %d went to %q, want %q", i, wheres[i], want[i])
		}
		if got, ok := s.Aside(wheres[i]); !ok || string(got) != content {
			t.Errorf("Aside(%q) = %q, %v; want %q", wheres[i], got, ok, content)
		}
	}
}

func TestRevisionNotReusedAfterMove(t *testing.T) {
	s := New()
	ctx := t.Context()
	rev1, _ := s.Save(ctx, []byte("a"), "")
	if _, err := s.MoveAside(ctx, "x"); err != nil {
		t.Fatal(err)
	}
	rev2, _ := s.Save(ctx, []byte("a"), "")
	if rev1 == rev2 {
		t.Errorf("revision %q reused after MoveAside", rev1)
	}
}
