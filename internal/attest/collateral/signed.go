package collateral

import (
	"encoding/hex"
	"encoding/json"
	"fmt"
	"time"
)

// TCBInfo is a decoded TCB info document (version 2 or 3).
type TCBInfo struct {
	ID                      string // "SGX" (v3; empty in v2)
	Version                 int
	IssueDate               time.Time
	NextUpdate              time.Time
	FMSPC                   [6]byte
	PCEID                   [2]byte
	TCBType                 int
	TCBEvaluationDataNumber int
	Levels                  []TCBLevel
}

// TCBLevel is one platform TCB level.
type TCBLevel struct {
	CompSVN    [16]uint8
	PCESVN     uint16
	Date       time.Time // zero if absent
	Status     string    // Intel's status string, as served
	Advisories []string
}

type tcbInfoJSON struct {
	ID                      string    `json:"id"`
	Version                 int       `json:"version"`
	IssueDate               time.Time `json:"issueDate"`
	NextUpdate              time.Time `json:"nextUpdate"`
	FMSPC                   string    `json:"fmspc"`
	PCEID                   string    `json:"pceId"`
	TCBType                 int       `json:"tcbType"`
	TCBEvaluationDataNumber int       `json:"tcbEvaluationDataNumber"`
	TCBLevels               []struct {
		TCB         json.RawMessage `json:"tcb"`
		TCBDate     string          `json:"tcbDate"`
		TCBStatus   string          `json:"tcbStatus"`
		AdvisoryIDs []string        `json:"advisoryIDs"`
	} `json:"tcbLevels"`
}

// ParseTCBInfo decodes the tcbInfo JSON object. Version 3 carries
// "sgxtcbcomponents"; version 2 the flat "sgxtcbcompNNsvn" fields. It checks
// structure only; the verifier checks id, version and signature.
func ParseTCBInfo(raw []byte) (*TCBInfo, error) {
	var j tcbInfoJSON
	if err := json.Unmarshal(raw, &j); err != nil {
		return nil, fmt.Errorf("%w: TCB info: %w", ErrFormat, err)
	}
	if j.Version != 2 && j.Version != 3 {
		return nil, fmt.Errorf("%w: TCB info: version %d (want 2 or 3)", ErrFormat, j.Version)
	}
	return j.decode(func(i int, tcb json.RawMessage, level *TCBLevel) error {
		if j.Version == 3 {
			return parseTCBv3(tcb, level)
		}
		return parseTCBv2(tcb, level)
	})
}

// decode builds the TCB info of an unmarshalled document; parseTCB
// decodes the "tcb" object of level i (whose kind depends on the version
// and on SGX or TDX) into level.
func (j *tcbInfoJSON) decode(parseTCB func(i int, tcb json.RawMessage, level *TCBLevel) error) (*TCBInfo, error) {
	info := &TCBInfo{
		ID: j.ID, Version: j.Version, IssueDate: j.IssueDate, NextUpdate: j.NextUpdate,
		TCBType: j.TCBType, TCBEvaluationDataNumber: j.TCBEvaluationDataNumber,
	}
	if err := hexField(j.FMSPC, info.FMSPC[:], "TCB info fmspc"); err != nil {
		return nil, err
	}
	if err := hexField(j.PCEID, info.PCEID[:], "TCB info pceId"); err != nil {
		return nil, err
	}
	if len(j.TCBLevels) == 0 {
		return nil, fmt.Errorf("%w: TCB info: no TCB levels", ErrFormat)
	}
	for i, l := range j.TCBLevels {
		level := TCBLevel{Status: l.TCBStatus, Advisories: l.AdvisoryIDs}
		if err := parseTCB(i, l.TCB, &level); err != nil {
			return nil, fmt.Errorf("%w: TCB info: level %d: %w", ErrFormat, i, err)
		}
		if l.TCBDate != "" {
			var err error
			if level.Date, err = time.Parse(time.RFC3339, l.TCBDate); err != nil {
				return nil, fmt.Errorf("%w: TCB info: level %d: tcbDate: %w", ErrFormat, i, err)
			}
		}
		if l.TCBStatus == "" {
			return nil, fmt.Errorf("%w: TCB info: level %d: no tcbStatus", ErrFormat, i)
		}
		info.Levels = append(info.Levels, level)
	}
	return info, nil
}

// tcbV3JSON is the "tcb" object of a version 3 TCB level; TDX levels
// also carry "tdxtcbcomponents".
type tcbV3JSON struct {
	SGX    tcbComponents `json:"sgxtcbcomponents"`
	TDX    tcbComponents `json:"tdxtcbcomponents"`
	PCESVN *int          `json:"pcesvn"`
}

type tcbComponents []struct {
	SVN *int `json:"svn"`
}

// decode reads the 16 SVNs of the components named name into dst.
func (c tcbComponents) decode(dst *[16]uint8, name string) error {
	if len(c) != len(dst) {
		return fmt.Errorf("%d %s, want 16", len(c), name)
	}
	for i, comp := range c {
		if err := svn8(comp.SVN, &dst[i], fmt.Sprintf("%s[%d]", name, i)); err != nil {
			return err
		}
	}
	return nil
}

// sgx decodes the SGX side of a version 3 level.
func (t *tcbV3JSON) sgx(level *TCBLevel) error {
	if err := t.SGX.decode(&level.CompSVN, "sgxtcbcomponents"); err != nil {
		return err
	}
	return svn16(t.PCESVN, &level.PCESVN, "pcesvn")
}

func parseTCBv3(raw json.RawMessage, level *TCBLevel) error {
	var t tcbV3JSON
	if err := json.Unmarshal(raw, &t); err != nil {
		return err
	}
	return t.sgx(level)
}

func parseTCBv2(raw json.RawMessage, level *TCBLevel) error {
	var t map[string]*int
	if err := json.Unmarshal(raw, &t); err != nil {
		return err
	}
	for i := range level.CompSVN {
		name := fmt.Sprintf("sgxtcbcomp%02dsvn", i+1)
		if err := svn8(t[name], &level.CompSVN[i], name); err != nil {
			return err
		}
	}
	return svn16(t["pcesvn"], &level.PCESVN, "pcesvn")
}

func svn8(v *int, dst *uint8, name string) error {
	if v == nil || *v < 0 || *v > 0xff {
		return fmt.Errorf("%s missing or out of range 0..255", name)
	}
	*dst = uint8(*v)
	return nil
}

func svn16(v *int, dst *uint16, name string) error {
	if v == nil || *v < 0 || *v > 0xffff {
		return fmt.Errorf("%s missing or out of range 0..65535", name)
	}
	*dst = uint16(*v)
	return nil
}

// QEIdentity is a decoded enclave identity document (version 2) of the
// quoting enclave.
type QEIdentity struct {
	ID                      string // "QE"
	Version                 int
	IssueDate               time.Time
	NextUpdate              time.Time
	TCBEvaluationDataNumber int
	MiscSelect              uint32
	MiscSelectMask          uint32
	Attributes              [16]byte
	AttributesMask          [16]byte
	MRSIGNER                [32]byte
	ISVProdID               uint16
	Levels                  []QELevel
}

// QELevel is one TCB level of the quoting enclave.
type QELevel struct {
	ISVSVN     uint16
	Date       time.Time // zero if absent
	Status     string
	Advisories []string
}

// ParseQEIdentity decodes the enclaveIdentity JSON object (version 2). It
// checks structure only; the verifier checks id, version and signature.
func ParseQEIdentity(raw []byte) (*QEIdentity, error) {
	var j struct {
		ID                      string    `json:"id"`
		Version                 int       `json:"version"`
		IssueDate               time.Time `json:"issueDate"`
		NextUpdate              time.Time `json:"nextUpdate"`
		TCBEvaluationDataNumber int       `json:"tcbEvaluationDataNumber"`
		MiscSelect              string    `json:"miscselect"`
		MiscSelectMask          string    `json:"miscselectMask"`
		Attributes              string    `json:"attributes"`
		AttributesMask          string    `json:"attributesMask"`
		MRSIGNER                string    `json:"mrsigner"`
		ISVProdID               *int      `json:"isvprodid"`
		TCBLevels               []struct {
			TCB struct {
				ISVSVN *int `json:"isvsvn"`
			} `json:"tcb"`
			TCBDate     string   `json:"tcbDate"`
			TCBStatus   string   `json:"tcbStatus"`
			AdvisoryIDs []string `json:"advisoryIDs"`
		} `json:"tcbLevels"`
	}
	if err := json.Unmarshal(raw, &j); err != nil {
		return nil, fmt.Errorf("%w: QE identity: %w", ErrFormat, err)
	}
	if j.Version != 2 {
		return nil, fmt.Errorf("%w: QE identity: version %d (want 2)", ErrFormat, j.Version)
	}
	id := &QEIdentity{
		ID: j.ID, Version: j.Version, IssueDate: j.IssueDate, NextUpdate: j.NextUpdate,
		TCBEvaluationDataNumber: j.TCBEvaluationDataNumber,
	}
	var misc, miscMask [4]byte
	for _, f := range []struct {
		s    string
		dst  []byte
		name string
	}{
		{j.MiscSelect, misc[:], "miscselect"},
		{j.MiscSelectMask, miscMask[:], "miscselectMask"},
		{j.Attributes, id.Attributes[:], "attributes"},
		{j.AttributesMask, id.AttributesMask[:], "attributesMask"},
		{j.MRSIGNER, id.MRSIGNER[:], "mrsigner"},
	} {
		if err := hexField(f.s, f.dst, "QE identity "+f.name); err != nil {
			return nil, err
		}
	}
	// miscselect is written as a big-endian hex number.
	id.MiscSelect = uint32(misc[0])<<24 | uint32(misc[1])<<16 | uint32(misc[2])<<8 | uint32(misc[3])
	id.MiscSelectMask = uint32(miscMask[0])<<24 | uint32(miscMask[1])<<16 | uint32(miscMask[2])<<8 | uint32(miscMask[3])
	if err := svn16(j.ISVProdID, &id.ISVProdID, "isvprodid"); err != nil {
		return nil, fmt.Errorf("%w: QE identity: %w", ErrFormat, err)
	}
	if len(j.TCBLevels) == 0 {
		return nil, fmt.Errorf("%w: QE identity: no TCB levels", ErrFormat)
	}
	for i, l := range j.TCBLevels {
		level := QELevel{Status: l.TCBStatus, Advisories: l.AdvisoryIDs}
		if err := svn16(l.TCB.ISVSVN, &level.ISVSVN, "isvsvn"); err != nil {
			return nil, fmt.Errorf("%w: QE identity: level %d: %w", ErrFormat, i, err)
		}
		if l.TCBDate != "" {
			var err error
			if level.Date, err = time.Parse(time.RFC3339, l.TCBDate); err != nil {
				return nil, fmt.Errorf("%w: QE identity: level %d: tcbDate: %w", ErrFormat, i, err)
			}
		}
		if l.TCBStatus == "" {
			return nil, fmt.Errorf("%w: QE identity: level %d: no tcbStatus", ErrFormat, i)
		}
		id.Levels = append(id.Levels, level)
	}
	return id, nil
}

// hexField decodes s, which must be exactly 2*len(dst) hex digits.
func hexField(s string, dst []byte, name string) error {
	if len(s) != 2*len(dst) {
		return fmt.Errorf("%w: %s: %d hex digits, want %d", ErrFormat, name, len(s), 2*len(dst))
	}
	if _, err := hex.Decode(dst, []byte(s)); err != nil {
		return fmt.Errorf("%w: %s: %w", ErrFormat, name, err)
	}
	return nil
}
