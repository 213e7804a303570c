package dcaptest

import (
	"crypto/ecdsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/binary"
	"encoding/pem"
	"testing"

	"github.com/quarry-cc/quarry/internal/attest/pck"
	"github.com/quarry-cc/quarry/internal/attest/sgxquote"
)

// QE describes the fake quoting enclave of a platform.
type QE struct {
	MRSIGNER   [32]byte
	ISVProdID  uint16
	ISVSVN     uint16
	MiscSelect uint32
	Attributes [16]byte // flags then XFRM, little-endian, as in the report
	QESVN      uint16   // header qe_svn
}

// Platform is a synthetic SGX machine: a PCK key and certificate issued by
// the PKI, and a quoting enclave.
type Platform struct {
	PKI    *PKI
	Ext    pck.Extension
	PCKKey *ecdsa.PrivateKey
	PCK    *x509.Certificate
	QE     QE
}

// NewPlatform issues a PCK certificate with ext and sets up a QE with
// ISVSVN 8, ISVPRODID 1 and Intel-like attributes.
func (p *PKI) NewPlatform(tb testing.TB, ext pck.Extension) *Platform {
	tb.Helper()
	pl := &Platform{PKI: p, Ext: ext, PCKKey: newKey(tb)}
	pl.PCK = p.IssuePCK(tb, ext, pl.PCKKey)
	pl.QE = QE{ISVProdID: 1, ISVSVN: 8, QESVN: 8}
	copy(pl.QE.MRSIGNER[:], "synthetic quoting enclave signer")
	pl.QE.Attributes[0] = sgxquote.AttributeInit | sgxquote.AttributeMode64Bit | sgxquote.AttributeProvisionKey
	pl.QE.Attributes[8] = 0xe7
	return pl
}

// ChainPEM returns the type-5 certification data: PEM of the PCK leaf, the
// intermediate and the root, followed by a NUL byte as DCAP emits it.
func (pl *Platform) ChainPEM() []byte {
	var out []byte
	for _, c := range []*x509.Certificate{pl.PCK, pl.PKI.PCKCA, pl.PKI.Root} {
		out = append(out, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})...)
	}
	return append(out, 0)
}

// Enclave describes the ISV enclave whose report a quote carries.
type Enclave struct {
	MRENCLAVE  [32]byte
	MRSIGNER   [32]byte
	ISVProdID  uint16
	ISVSVN     uint16
	Debug      bool
	ReportData [64]byte
}

// QuoteOptions shape a synthetic quote. The zero value gives a valid v3
// quote with type-5 certification data.
type QuoteOptions struct {
	Version      uint16 // 0 means 3; 4 and 5 carry an SGX body
	Enclave      Enclave
	AuthData     []byte // nil means 32 bytes 0, 1, …, 31
	CertType     uint16 // 0 means 5
	CertData     []byte // nil means ChainPEM
	BreakBinding bool   // QE report data does not hash the attestation key
}

// Quote produces a quote signed by the platform's fake QE.
func (pl *Platform) Quote(tb testing.TB, o QuoteOptions) []byte {
	tb.Helper()
	if o.Version == 0 {
		o.Version = sgxquote.Version3
	}
	if o.AuthData == nil {
		o.AuthData = make([]byte, 32)
		for i := range o.AuthData {
			o.AuthData[i] = byte(i)
		}
	}
	if o.CertType == 0 {
		o.CertType = sgxquote.CertTypePCKChain
	}
	if o.CertData == nil {
		o.CertData = pl.ChainPEM()
	}
	ak := newKey(tb)
	akBytes, err := ak.PublicKey.Bytes()
	if err != nil {
		tb.Fatalf("dcaptest: attestation key: %v", err)
	}
	akBytes = akBytes[1:] // drop the 0x04 prefix: X‖Y

	// QE report.
	var qe sgxquote.ReportBody
	copy(qe[0:16], pl.Ext.CPUSVN[:])
	binary.LittleEndian.PutUint32(qe[16:], pl.QE.MiscSelect)
	copy(qe[48:64], pl.QE.Attributes[:])
	copy(qe[128:160], pl.QE.MRSIGNER[:])
	binary.LittleEndian.PutUint16(qe[256:], pl.QE.ISVProdID)
	binary.LittleEndian.PutUint16(qe[258:], pl.QE.ISVSVN)
	binding := sha256.Sum256(append(append([]byte{}, akBytes...), o.AuthData...))
	if o.BreakBinding {
		binding[0] ^= 1
	}
	copy(qe[320:352], binding[:])
	qeSig := SignRaw(tb, pl.PCKKey, qe[:])

	// Header and ISV enclave report body.
	hdr := make([]byte, sgxquote.HeaderSize)
	binary.LittleEndian.PutUint16(hdr[0:], o.Version)
	binary.LittleEndian.PutUint16(hdr[2:], sgxquote.AttestationKeyECDSAP256)
	if o.Version == sgxquote.Version3 {
		binary.LittleEndian.PutUint16(hdr[8:], pl.QE.QESVN)
		binary.LittleEndian.PutUint16(hdr[10:], pl.Ext.PCESVN)
	}
	vendor := sgxquote.IntelQEVendorID()
	copy(hdr[12:28], vendor[:])
	copy(hdr[28:44], "synthetic-qe-id!")
	var body sgxquote.ReportBody
	e := o.Enclave
	copy(body[0:16], pl.Ext.CPUSVN[:])
	flags := uint64(sgxquote.AttributeInit | sgxquote.AttributeMode64Bit)
	if e.Debug {
		flags |= sgxquote.AttributeDebug
	}
	binary.LittleEndian.PutUint64(body[48:], flags)
	binary.LittleEndian.PutUint64(body[56:], 3)
	copy(body[64:96], e.MRENCLAVE[:])
	copy(body[128:160], e.MRSIGNER[:])
	binary.LittleEndian.PutUint16(body[256:], e.ISVProdID)
	binary.LittleEndian.PutUint16(body[258:], e.ISVSVN)
	copy(body[320:384], e.ReportData[:])

	signed := hdr
	if o.Version == sgxquote.Version5 {
		signed = binary.LittleEndian.AppendUint16(signed, sgxquote.BodyTypeSGX)
		signed = binary.LittleEndian.AppendUint32(signed, sgxquote.ReportBodySize)
	}
	signed = append(signed, body[:]...)

	// QE report certification data: QE report, its signature, auth data,
	// PCK certification data. Inline in v3, inside type 6 in v4/v5.
	var qeData []byte
	qeData = append(qeData, qe[:]...)
	qeData = append(qeData, qeSig...)
	qeData = binary.LittleEndian.AppendUint16(qeData, uint16(len(o.AuthData)))
	qeData = append(qeData, o.AuthData...)
	qeData = appendCertData(qeData, o.CertType, o.CertData)

	sigData := SignRaw(tb, ak, signed)
	sigData = append(sigData, akBytes...)
	if o.Version == sgxquote.Version3 {
		sigData = append(sigData, qeData...)
	} else {
		sigData = appendCertData(sigData, sgxquote.CertTypeQEReport, qeData)
	}
	quote := append(signed, binary.LittleEndian.AppendUint32(nil, uint32(len(sigData)))...)
	return append(quote, sigData...)
}

func appendCertData(b []byte, typ uint16, data []byte) []byte {
	b = binary.LittleEndian.AppendUint16(b, typ)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(data)))
	return append(b, data...)
}
