package pck_test

import (
	"crypto/x509"
	"encoding/asn1"
	"errors"
	"os"
	"reflect"
	"slices"
	"testing"

	"github.com/quarry-cc/quarry/internal/attest/dcaptest"
	"github.com/quarry-cc/quarry/internal/attest/pck"
	"github.com/quarry-cc/quarry/internal/attest/sgxquote"
)

func TestPhalaLeaf(t *testing.T) {
	raw, err := os.ReadFile(dcaptest.SGXTestdata(t, dcaptest.PhalaQuoteFile))
	if err != nil {
		t.Fatal(err)
	}
	q, err := sgxquote.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	chain, err := q.PCKChain()
	if err != nil {
		t.Fatal(err)
	}
	ext, err := pck.FromCertificate(chain[0])
	if err != nil {
		t.Fatal(err)
	}
	want := [16]uint8{11, 11, 2, 2, 255, 1}
	switch {
	case ext.FMSPC != [6]byte{0x00, 0xa0, 0x67, 0x11, 0x00, 0x00}:
		t.Errorf("FMSPC = %X", ext.FMSPC)
	case ext.PCEID != [2]byte{}:
		t.Errorf("PCE-ID = %X", ext.PCEID)
	case ext.CompSVN != want:
		t.Errorf("comp SVNs = %v, want %v", ext.CompSVN, want)
	case ext.PCESVN != 13:
		t.Errorf("PCESVN = %d", ext.PCESVN)
	case ext.CPUSVN != [16]byte(want[:]):
		t.Errorf("CPUSVN = %x", ext.CPUSVN)
	case ext.SGXType != pck.SGXTypeStandard:
		t.Errorf("SGX type = %d", ext.SGXType)
	case ext.Configuration != nil:
		t.Errorf("Processor-CA PCK has a configuration: %+v", ext.Configuration)
	}
	if _, err := pck.FromCertificate(chain[1]); !errors.Is(err, pck.ErrNoExtension) {
		t.Errorf("intermediate: err = %v, want ErrNoExtension", err)
	}
}

func TestRoundTrip(t *testing.T) {
	yes, no := true, false
	full := dcaptest.DefaultExtension()
	full.CompSVN = [16]uint8{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 254, 255}
	full.PCESVN = 0xfffe
	full.PCEID = [2]byte{0xab, 0xcd}
	full.SGXType = pck.SGXTypeScalable
	full.PlatformInstanceID = []byte("platform-instanc")
	full.Configuration = &pck.Configuration{DynamicPlatform: &yes, CachedKeys: &no, SMTEnabled: &yes}
	partial := full
	partial.Configuration = &pck.Configuration{CachedKeys: &yes}
	for name, ext := range map[string]pck.Extension{
		"default":       dcaptest.DefaultExtension(),
		"platform CA":   full,
		"partial flags": partial,
	} {
		got, err := pck.Parse(dcaptest.MarshalExtension(t, ext))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if !reflect.DeepEqual(*got, ext) {
			t.Errorf("%s: got %+v, want %+v", name, *got, ext)
		}
	}
	pl := dcaptest.NewPKI(t).NewPlatform(t, full)
	got, err := pck.FromCertificate(pl.PCK)
	if err != nil || !reflect.DeepEqual(*got, full) {
		t.Errorf("FromCertificate = %+v, %v", got, err)
	}
}

type pair struct {
	ID    asn1.ObjectIdentifier
	Value any
}

func oid(arcs ...int) asn1.ObjectIdentifier {
	return append(pck.OIDSGXExtension(), arcs...)
}

// build encodes an extension from valid parts after edit changed them.
func build(t *testing.T, edit func(top, tcb *[]pair)) []byte {
	t.Helper()
	var tcb []pair
	for i := 1; i <= 16; i++ {
		tcb = append(tcb, pair{oid(2, i), 1})
	}
	tcb = append(tcb, pair{oid(2, 17), 13}, pair{oid(2, 18), make([]byte, 16)})
	top := []pair{
		{oid(1), make([]byte, 16)},
		{oid(3), []byte{0, 0}},
		{oid(4), make([]byte, 6)},
		{oid(5), asn1.Enumerated(0)},
	}
	edit(&top, &tcb)
	top = append(top, pair{oid(2), tcb})
	der, err := asn1.Marshal(top)
	if err != nil {
		t.Fatal(err)
	}
	return der
}

func without(list *[]pair, arcs ...int) {
	id := oid(arcs...)
	*list = slices.DeleteFunc(*list, func(p pair) bool { return p.ID.Equal(id) })
}

func replace(list *[]pair, v any, arcs ...int) {
	without(list, arcs...)
	*list = append(*list, pair{oid(arcs...), v})
}

func TestParseErrors(t *testing.T) {
	valid := build(t, func(_, _ *[]pair) {})
	if _, err := pck.Parse(valid); err != nil {
		t.Fatalf("baseline: %v", err)
	}
	for _, tc := range []struct {
		name string
		der  []byte
	}{
		{"empty", nil},
		{"not a sequence", []byte{0x04, 0x01, 0x00}},
		{"trailing bytes", append(slices.Clone(valid), 0x00)},
		{"no PPID", build(t, func(top, _ *[]pair) { without(top, 1) })},
		{"no TCB", func() []byte {
			der, _ := asn1.Marshal([]pair{{oid(1), make([]byte, 16)}, {oid(3), []byte{0, 0}}, {oid(4), make([]byte, 6)}, {oid(5), asn1.Enumerated(0)}})
			return der
		}()},
		{"no PCE-ID", build(t, func(top, _ *[]pair) { without(top, 3) })},
		{"no FMSPC", build(t, func(top, _ *[]pair) { without(top, 4) })},
		{"no SGX type", build(t, func(top, _ *[]pair) { without(top, 5) })},
		{"FMSPC 5 bytes", build(t, func(top, _ *[]pair) { replace(top, make([]byte, 5), 4) })},
		{"PPID as INTEGER", build(t, func(top, _ *[]pair) { replace(top, 7, 1) })},
		{"SGX type as INTEGER", build(t, func(top, _ *[]pair) { replace(top, 0, 5) })},
		{"duplicate FMSPC", build(t, func(top, _ *[]pair) { *top = append(*top, pair{oid(4), make([]byte, 6)}) })},
		{"comp SVN 256", build(t, func(_, tcb *[]pair) { replace(tcb, 256, 2, 3) })},
		{"comp SVN negative", build(t, func(_, tcb *[]pair) { replace(tcb, -1, 2, 3) })},
		{"comp SVN as OCTET STRING", build(t, func(_, tcb *[]pair) { replace(tcb, []byte{1}, 2, 3) })},
		{"no comp SVN 16", build(t, func(_, tcb *[]pair) { without(tcb, 2, 16) })},
		{"PCESVN 65536", build(t, func(_, tcb *[]pair) { replace(tcb, 65536, 2, 17) })},
		{"no PCESVN", build(t, func(_, tcb *[]pair) { without(tcb, 2, 17) })},
		{"no CPUSVN", build(t, func(_, tcb *[]pair) { without(tcb, 2, 18) })},
		{"CPUSVN 15 bytes", build(t, func(_, tcb *[]pair) { replace(tcb, make([]byte, 15), 2, 18) })},
		{"platform instance ID as INTEGER", build(t, func(top, _ *[]pair) { replace(top, 1, 6) })},
		{"configuration flag as INTEGER", build(t, func(top, _ *[]pair) { replace(top, []pair{{oid(7, 1), 1}}, 7) })},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if ext, err := pck.Parse(tc.der); !errors.Is(err, pck.ErrFormat) || ext != nil {
				t.Fatalf("Parse = %+v, %v; want ErrFormat", ext, err)
			}
		})
	}
}

func TestParseIgnoresUnknownFields(t *testing.T) {
	der := build(t, func(top, tcb *[]pair) {
		*top = append(*top, pair{oid(99), "future"}, pair{asn1.ObjectIdentifier{1, 2, 3}, 5})
		*tcb = append(*tcb, pair{oid(2, 19), 1})
	})
	if _, err := pck.Parse(der); err != nil {
		t.Fatal(err)
	}
}

func TestFromCertificateNoExtension(t *testing.T) {
	p := dcaptest.NewPKI(t)
	for _, c := range []*x509.Certificate{p.Root, p.PCKCA, p.TCBSigning} {
		if _, err := pck.FromCertificate(c); !errors.Is(err, pck.ErrNoExtension) {
			t.Errorf("%s: err = %v, want ErrNoExtension", c.Subject.CommonName, err)
		}
	}
}

func FuzzParse(f *testing.F) {
	f.Add(dcaptest.MarshalExtension(f, dcaptest.DefaultExtension()))
	yes := true
	ext := dcaptest.DefaultExtension()
	ext.PlatformInstanceID = make([]byte, 16)
	ext.Configuration = &pck.Configuration{SMTEnabled: &yes}
	f.Add(dcaptest.MarshalExtension(f, ext))
	f.Fuzz(func(t *testing.T, der []byte) {
		ext, err := pck.Parse(der)
		if err != nil {
			if !errors.Is(err, pck.ErrFormat) {
				t.Fatalf("error %v does not match ErrFormat", err)
			}
			return
		}
		// Whatever parses re-encodes to something that parses the same.
		again, err := pck.Parse(dcaptest.MarshalExtension(t, *ext))
		if err != nil || !reflect.DeepEqual(again, ext) {
			t.Fatalf("re-encoding differs: %+v, %v", again, err)
		}
	})
}
