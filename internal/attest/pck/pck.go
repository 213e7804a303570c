// Package pck decodes the Intel SGX extension (OID 1.2.840.113741.1.13.1) of
// a PCK certificate: the platform's PPID, TCB component SVNs, PCESVN, CPUSVN,
// PCE-ID, FMSPC, SGX type and the optional Platform-CA fields. It does not
// verify the certificate.
package pck

import (
	"crypto/x509"
	"encoding/asn1"
	"errors"
	"fmt"
	"slices"
)

// OIDSGXExtension returns the OID of the SGX extension of a PCK
// certificate, 1.2.840.113741.1.13.1.
func OIDSGXExtension() asn1.ObjectIdentifier {
	return asn1.ObjectIdentifier{1, 2, 840, 113741, 1, 13, 1}
}

var (
	// ErrFormat means the SGX extension is malformed or lacks a required field.
	ErrFormat = errors.New("pck: malformed SGX extension")
	// ErrNoExtension means the certificate has no SGX extension.
	ErrNoExtension = errors.New("pck: certificate has no SGX extension")
)

// SGXType is the platform's SGX type.
type SGXType int

// SGX types.
const (
	SGXTypeStandard              SGXType = 0
	SGXTypeScalable              SGXType = 1
	SGXTypeScalableWithIntegrity SGXType = 2
)

// Extension is the decoded SGX extension.
type Extension struct {
	PPID    [16]byte
	CompSVN [16]uint8 // SGX TCB component SVNs 1..16
	PCESVN  uint16
	CPUSVN  [16]byte
	PCEID   [2]byte
	FMSPC   [6]byte
	SGXType SGXType
	// PlatformInstanceID is present in certificates of the PCK Platform CA.
	PlatformInstanceID []byte
	// Configuration is present in certificates of the PCK Platform CA.
	Configuration *Configuration
}

// Configuration holds the optional platform configuration flags; a nil field
// was absent.
type Configuration struct {
	DynamicPlatform *bool
	CachedKeys      *bool
	SMTEnabled      *bool
}

// Arcs below the SGX extension OID.
const (
	arcPPID               = 1
	arcTCB                = 2
	arcPCEID              = 3
	arcFMSPC              = 4
	arcSGXType            = 5
	arcPlatformInstanceID = 6
	arcConfiguration      = 7

	arcPCESVN = 17 // inside TCB
	arcCPUSVN = 18 // inside TCB

	arcDynamicPlatform = 1 // inside Configuration
	arcCachedKeys      = 2
	arcSMTEnabled      = 3
)

// FromCertificate decodes the SGX extension of c.
func FromCertificate(c *x509.Certificate) (*Extension, error) {
	var found []byte
	oid := OIDSGXExtension()
	for _, e := range c.Extensions {
		if e.Id.Equal(oid) {
			if found != nil {
				return nil, fmt.Errorf("%w: extension appears twice", ErrFormat)
			}
			found = e.Value
		}
	}
	if found == nil {
		return nil, ErrNoExtension
	}
	return Parse(found)
}

// entry is one (OID, value) pair of the extension.
type entry struct {
	ID    asn1.ObjectIdentifier
	Value asn1.RawValue
}

// Parse decodes the DER value of the SGX extension.
func Parse(der []byte) (*Extension, error) {
	base := OIDSGXExtension()
	top, err := entries(der, base)
	if err != nil {
		return nil, err
	}
	var ext Extension
	for _, arc := range []int{arcPPID, arcTCB, arcPCEID, arcFMSPC, arcSGXType} {
		if _, ok := top[arc]; !ok {
			return nil, fmt.Errorf("%w: missing %s", ErrFormat, name(base, arc))
		}
	}
	if err := octets(top[arcPPID], ext.PPID[:], name(base, arcPPID)); err != nil {
		return nil, err
	}
	if err := octets(top[arcPCEID], ext.PCEID[:], name(base, arcPCEID)); err != nil {
		return nil, err
	}
	if err := octets(top[arcFMSPC], ext.FMSPC[:], name(base, arcFMSPC)); err != nil {
		return nil, err
	}
	var typ asn1.Enumerated
	if err := exact(top[arcSGXType], &typ, name(base, arcSGXType)); err != nil {
		return nil, err
	}
	ext.SGXType = SGXType(typ)
	if err := parseTCB(top[arcTCB], base, &ext); err != nil {
		return nil, err
	}
	if v, ok := top[arcPlatformInstanceID]; ok {
		if v.Class != asn1.ClassUniversal || v.Tag != asn1.TagOctetString || v.IsCompound {
			return nil, fmt.Errorf("%w: %s is not an OCTET STRING", ErrFormat, name(base, arcPlatformInstanceID))
		}
		ext.PlatformInstanceID = slices.Clone(v.Bytes)
	}
	if v, ok := top[arcConfiguration]; ok {
		c, err := parseConfiguration(v, base)
		if err != nil {
			return nil, err
		}
		ext.Configuration = c
	}
	return &ext, nil
}

func parseTCB(v asn1.RawValue, base asn1.ObjectIdentifier, ext *Extension) error {
	tcbOID := append(slices.Clone(base), arcTCB)
	m, err := entries(v.FullBytes, tcbOID)
	if err != nil {
		return err
	}
	for i := range ext.CompSVN {
		arc := i + 1
		raw, ok := m[arc]
		if !ok {
			return fmt.Errorf("%w: missing %s", ErrFormat, name(tcbOID, arc))
		}
		var svn int
		if err := exact(raw, &svn, name(tcbOID, arc)); err != nil {
			return err
		}
		if svn < 0 || svn > 0xff {
			return fmt.Errorf("%w: %s = %d out of range 0..255", ErrFormat, name(tcbOID, arc), svn)
		}
		ext.CompSVN[i] = uint8(svn)
	}
	raw, ok := m[arcPCESVN]
	if !ok {
		return fmt.Errorf("%w: missing PCESVN %s", ErrFormat, name(tcbOID, arcPCESVN))
	}
	var pcesvn int
	if err := exact(raw, &pcesvn, name(tcbOID, arcPCESVN)); err != nil {
		return err
	}
	if pcesvn < 0 || pcesvn > 0xffff {
		return fmt.Errorf("%w: PCESVN %d out of range 0..65535", ErrFormat, pcesvn)
	}
	ext.PCESVN = uint16(pcesvn)
	raw, ok = m[arcCPUSVN]
	if !ok {
		return fmt.Errorf("%w: missing CPUSVN %s", ErrFormat, name(tcbOID, arcCPUSVN))
	}
	return octets(raw, ext.CPUSVN[:], name(tcbOID, arcCPUSVN))
}

func parseConfiguration(v asn1.RawValue, base asn1.ObjectIdentifier) (*Configuration, error) {
	confOID := append(slices.Clone(base), arcConfiguration)
	m, err := entries(v.FullBytes, confOID)
	if err != nil {
		return nil, err
	}
	var c Configuration
	for arc, dst := range map[int]**bool{arcDynamicPlatform: &c.DynamicPlatform, arcCachedKeys: &c.CachedKeys, arcSMTEnabled: &c.SMTEnabled} {
		raw, ok := m[arc]
		if !ok {
			continue
		}
		var b bool
		if err := exact(raw, &b, name(confOID, arc)); err != nil {
			return nil, err
		}
		*dst = &b
	}
	return &c, nil
}

// entries decodes a SEQUENCE of (OID, value) pairs whose OIDs are parent.N
// and returns the values by N. Duplicates are an error; other OIDs are
// ignored, so that future fields do not break parsing.
func entries(der []byte, parent asn1.ObjectIdentifier) (map[int]asn1.RawValue, error) {
	var list []entry
	rest, err := asn1.Unmarshal(der, &list)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrFormat, parent, err)
	}
	if len(rest) != 0 {
		return nil, fmt.Errorf("%w: %s: %d trailing bytes", ErrFormat, parent, len(rest))
	}
	m := make(map[int]asn1.RawValue, len(list))
	for _, e := range list {
		if len(e.ID) != len(parent)+1 || !slices.Equal(e.ID[:len(parent)], parent) {
			continue
		}
		arc := e.ID[len(parent)]
		if _, dup := m[arc]; dup {
			return nil, fmt.Errorf("%w: %s appears twice", ErrFormat, e.ID)
		}
		m[arc] = e.Value
	}
	return m, nil
}

// octets requires v to be an OCTET STRING of exactly len(dst) bytes.
func octets(v asn1.RawValue, dst []byte, what string) error {
	if v.Class != asn1.ClassUniversal || v.Tag != asn1.TagOctetString || v.IsCompound {
		return fmt.Errorf("%w: %s is not an OCTET STRING", ErrFormat, what)
	}
	if len(v.Bytes) != len(dst) {
		return fmt.Errorf("%w: %s has %d bytes, want %d", ErrFormat, what, len(v.Bytes), len(dst))
	}
	copy(dst, v.Bytes)
	return nil
}

// exact decodes v into dst, which must consume it entirely.
func exact(v asn1.RawValue, dst any, what string) error {
	rest, err := asn1.Unmarshal(v.FullBytes, dst)
	if err != nil {
		return fmt.Errorf("%w: %s: %w", ErrFormat, what, err)
	}
	if len(rest) != 0 {
		return fmt.Errorf("%w: %s: trailing bytes", ErrFormat, what)
	}
	return nil
}

func name(parent asn1.ObjectIdentifier, arc int) string {
	return append(slices.Clone(parent), arc).String()
}
