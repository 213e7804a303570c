package collateral

import (
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"time"
)

// TDXProvider supplies the collateral for TDX quotes: TDX TCB info (id
// "TDX") and the TD quoting enclave's identity (id "TD_QE"), with the same
// PCK and root CA CRLs as for SGX. Providers that serve both kinds
// implement Provider and TDXProvider.
type TDXProvider interface {
	GetTDX(ctx context.Context, fmspc [6]byte, ca CA) (*Collateral, error)
}

var (
	_ TDXProvider = Static{}
	_ TDXProvider = File{}
	_ TDXProvider = (*Cache)(nil)
)

// GetTDX returns s.Collateral, or ErrNotFound when it is nil.
func (s Static) GetTDX(ctx context.Context, fmspc [6]byte, ca CA) (*Collateral, error) {
	return s.Get(ctx, fmspc, ca)
}

// File names of TDX collateral in a directory of raw PCS/PCCS responses;
// CRLs and their chains are shared with SGX (FilePCKCRL, FileRootCACRL).
const (
	FileTDXTCBInfo               = "tdx-tcbinfo.json"                // GET /tdx/certification/v4/tcb?fmspc=…
	FileTDXTCBInfoIssuerChain    = "tdx-tcbinfo-issuer-chain.pem"    // TCB-Info-Issuer-Chain
	FileTDXQEIdentity            = "tdx-qeidentity.json"             // GET /tdx/certification/v4/qe/identity
	FileTDXQEIdentityIssuerChain = "tdx-qeidentity-issuer-chain.pem" // SGX-Enclave-Identity-Issuer-Chain
)

// GetTDX reads TDX collateral: a JSON file in dcap-qvl's shape holds the
// collateral of one platform whatever its kind (the verifier checks the
// documents' ids); a directory holds it under the tdx-* file names.
func (f File) GetTDX(ctx context.Context, fmspc [6]byte, ca CA) (*Collateral, error) {
	col, err := f.Get(ctx, fmspc, ca)
	if err != nil || !f.isDir() {
		return col, err
	}
	// Replace the SGX documents with the TDX ones.
	tdx, err := FromFS(tdxFS{f.Path}, ca)
	if err != nil {
		return nil, err
	}
	return tdx, nil
}

// TDXTCBInfo is a decoded TDX TCB info document (id "TDX", version 3).
type TDXTCBInfo struct {
	ID                      string
	Version                 int
	IssueDate               time.Time
	NextUpdate              time.Time
	FMSPC                   [6]byte
	PCEID                   [2]byte
	TCBType                 int
	TCBEvaluationDataNumber int
	// Module is "tdxModule": the identity used when no versioned identity
	// applies.
	Module TDXModule
	// ModuleIdentities are "tdxModuleIdentities", selected by the module's
	// major version (id "TDX_%02X").
	ModuleIdentities []TDXModuleIdentity
	Levels           []TDXTCBLevel
}

// TDXModule is the identity of the TDX module: the signer of the SEAM module
// and its attributes.
type TDXModule struct {
	MRSIGNER       [48]byte
	Attributes     [8]byte
	AttributesMask [8]byte
}

// TDXModuleIdentity is one versioned TDX module identity with its own TCB
// levels (by ISVSVN = TEE_TCB_SVN[0]).
type TDXModuleIdentity struct {
	ID string
	TDXModule
	Levels []QELevel
}

// TDXTCBLevel is a platform TCB level of TDX TCB info: the SGX side
// (components and PCESVN) and the TDX components compared with TEE_TCB_SVN.
type TDXTCBLevel struct {
	TCBLevel
	TDXCompSVN [16]uint8
}

// ParseTDXTCBInfo decodes a TDX tcbInfo JSON object (version 3). It checks
// structure only; the verifier checks id, signature and dates.
func ParseTDXTCBInfo(raw []byte) (*TDXTCBInfo, error) {
	var j struct {
		tcbInfoJSON
		TDXModule *struct {
			MRSIGNER       string `json:"mrsigner"`
			Attributes     string `json:"attributes"`
			AttributesMask string `json:"attributesMask"`
		} `json:"tdxModule"`
		TDXModuleIdentities []struct {
			ID             string `json:"id"`
			MRSIGNER       string `json:"mrsigner"`
			Attributes     string `json:"attributes"`
			AttributesMask string `json:"attributesMask"`
			TCBLevels      []struct {
				TCB struct {
					ISVSVN *int `json:"isvsvn"`
				} `json:"tcb"`
				TCBDate     string   `json:"tcbDate"`
				TCBStatus   string   `json:"tcbStatus"`
				AdvisoryIDs []string `json:"advisoryIDs"`
			} `json:"tcbLevels"`
		} `json:"tdxModuleIdentities"`
	}
	if err := json.Unmarshal(raw, &j); err != nil {
		return nil, fmt.Errorf("%w: TDX TCB info: %w", ErrFormat, err)
	}
	if j.Version != 3 {
		return nil, fmt.Errorf("%w: TDX TCB info: version %d (want 3)", ErrFormat, j.Version)
	}
	// Each level's "tcb" is decoded once, both sides.
	tdxComps := make([][16]uint8, len(j.TCBLevels))
	base, err := j.tcbInfoJSON.decode(func(i int, raw json.RawMessage, level *TCBLevel) error {
		var t tcbV3JSON
		if err := json.Unmarshal(raw, &t); err != nil {
			return err
		}
		if err := t.sgx(level); err != nil {
			return err
		}
		return t.TDX.decode(&tdxComps[i], "tdxtcbcomponents")
	})
	if err != nil {
		return nil, err
	}
	info := &TDXTCBInfo{
		ID: base.ID, Version: base.Version, IssueDate: base.IssueDate, NextUpdate: base.NextUpdate,
		FMSPC: base.FMSPC, PCEID: base.PCEID, TCBType: base.TCBType, TCBEvaluationDataNumber: base.TCBEvaluationDataNumber,
	}
	if j.TDXModule == nil {
		return nil, fmt.Errorf("%w: TDX TCB info: no tdxModule", ErrFormat)
	}
	if err := decodeModule(&info.Module, j.TDXModule.MRSIGNER, j.TDXModule.Attributes, j.TDXModule.AttributesMask, "tdxModule"); err != nil {
		return nil, err
	}
	for i, m := range j.TDXModuleIdentities {
		id := TDXModuleIdentity{ID: m.ID}
		name := fmt.Sprintf("tdxModuleIdentities[%d]", i)
		if err := decodeModule(&id.TDXModule, m.MRSIGNER, m.Attributes, m.AttributesMask, name); err != nil {
			return nil, err
		}
		if len(m.TCBLevels) == 0 {
			return nil, fmt.Errorf("%w: TDX TCB info: %s: no TCB levels", ErrFormat, name)
		}
		for k, l := range m.TCBLevels {
			level := QELevel{Status: l.TCBStatus, Advisories: l.AdvisoryIDs}
			if err := svn16(l.TCB.ISVSVN, &level.ISVSVN, "isvsvn"); err != nil {
				return nil, fmt.Errorf("%w: TDX TCB info: %s level %d: %w", ErrFormat, name, k, err)
			}
			if l.TCBDate != "" {
				if level.Date, err = time.Parse(time.RFC3339, l.TCBDate); err != nil {
					return nil, fmt.Errorf("%w: TDX TCB info: %s level %d: tcbDate: %w", ErrFormat, name, k, err)
				}
			}
			if l.TCBStatus == "" {
				return nil, fmt.Errorf("%w: TDX TCB info: %s level %d: no tcbStatus", ErrFormat, name, k)
			}
			id.Levels = append(id.Levels, level)
		}
		info.ModuleIdentities = append(info.ModuleIdentities, id)
	}
	for i, l := range base.Levels {
		info.Levels = append(info.Levels, TDXTCBLevel{TCBLevel: l, TDXCompSVN: tdxComps[i]})
	}
	return info, nil
}

func decodeModule(m *TDXModule, mrsigner, attr, mask, name string) error {
	if err := hexField(mrsigner, m.MRSIGNER[:], "TDX TCB info "+name+" mrsigner"); err != nil {
		return err
	}
	if err := hexField(attr, m.Attributes[:], "TDX TCB info "+name+" attributes"); err != nil {
		return err
	}
	return hexField(mask, m.AttributesMask[:], "TDX TCB info "+name+" attributesMask")
}

func (f File) isDir() bool {
	info, err := os.Stat(f.Path)
	return err == nil && info.IsDir()
}

// tdxFS reads a collateral directory with the TDX documents in place of the
// SGX ones.
type tdxFS struct{ dir string }

var tdxNames = map[string]string{
	FileTCBInfo:               FileTDXTCBInfo,
	FileTCBInfoIssuerChain:    FileTDXTCBInfoIssuerChain,
	FileQEIdentity:            FileTDXQEIdentity,
	FileQEIdentityIssuerChain: FileTDXQEIdentityIssuerChain,
}

func (t tdxFS) Open(name string) (fs.File, error) {
	if n, ok := tdxNames[name]; ok {
		name = n
	}
	return os.DirFS(t.dir).Open(name)
}

// GetTDX returns cached TDX collateral that is still before its nextUpdate,
// or fetches it from the source, which must implement TDXProvider.
func (c *Cache) GetTDX(ctx context.Context, fmspc [6]byte, ca CA) (*Collateral, error) {
	src, ok := c.src.(TDXProvider)
	if !ok {
		return nil, fmt.Errorf("%w: the collateral source serves no TDX collateral", ErrNotFound)
	}
	return c.get(ctx, cacheKey{fmspc: fmspc, ca: ca, tdx: true}, src.GetTDX)
}
