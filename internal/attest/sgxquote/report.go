package sgxquote

import "encoding/binary"

// ReportBody is an SGX report body (sgx_report_body_t), 384 bytes. The
// accessors decode its fields; integers are little-endian.
type ReportBody [ReportBodySize]byte

// Attribute flag bits of Attributes.Flags.
const (
	AttributeInit         = 0x01
	AttributeDebug        = 0x02
	AttributeMode64Bit    = 0x04
	AttributeProvisionKey = 0x10
	AttributeEINITToken   = 0x20
	AttributeKSS          = 0x80
)

// Attributes are the enclave attributes: flags and XFRM.
type Attributes struct {
	Flags uint64
	XFRM  uint64
}

// CPUSVN returns the CPU security version.
func (r *ReportBody) CPUSVN() [16]byte { return [16]byte(r[0:16]) }

// MiscSelect returns the MISCSELECT field.
func (r *ReportBody) MiscSelect() uint32 { return binary.LittleEndian.Uint32(r[16:20]) }

// ISVExtProdID returns the extended product ID.
func (r *ReportBody) ISVExtProdID() [16]byte { return [16]byte(r[32:48]) }

// AttributesRaw returns the 16 attribute bytes as stored (flags, then XFRM).
func (r *ReportBody) AttributesRaw() [16]byte { return [16]byte(r[48:64]) }

// Attributes returns the decoded attributes.
func (r *ReportBody) Attributes() Attributes {
	return Attributes{Flags: binary.LittleEndian.Uint64(r[48:56]), XFRM: binary.LittleEndian.Uint64(r[56:64])}
}

// Debug reports whether the enclave is a debug enclave (attribute DEBUG).
func (r *ReportBody) Debug() bool { return r.Attributes().Flags&AttributeDebug != 0 }

// MRENCLAVE returns the enclave measurement (MarbleRun's UniqueID).
func (r *ReportBody) MRENCLAVE() [32]byte { return [32]byte(r[64:96]) }

// MRSIGNER returns the hash of the enclave signer's key (MarbleRun's SignerID).
func (r *ReportBody) MRSIGNER() [32]byte { return [32]byte(r[128:160]) }

// ConfigID returns the CONFIGID field.
func (r *ReportBody) ConfigID() [64]byte { return [64]byte(r[192:256]) }

// ISVProdID returns the product ID (MarbleRun's ProductID).
func (r *ReportBody) ISVProdID() uint16 { return binary.LittleEndian.Uint16(r[256:258]) }

// ISVSVN returns the security version (MarbleRun's SecurityVersion).
func (r *ReportBody) ISVSVN() uint16 { return binary.LittleEndian.Uint16(r[258:260]) }

// ConfigSVN returns the CONFIGSVN field.
func (r *ReportBody) ConfigSVN() uint16 { return binary.LittleEndian.Uint16(r[260:262]) }

// ISVFamilyID returns the product family ID.
func (r *ReportBody) ISVFamilyID() [16]byte { return [16]byte(r[304:320]) }

// ReportData returns the 64 bytes of REPORTDATA.
func (r *ReportBody) ReportData() [64]byte { return [64]byte(r[320:384]) }
