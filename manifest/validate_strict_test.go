package manifest

import (
	"errors"
	"strings"
	"testing"
)

// hex64 is a valid SignerID/UniqueID.
const hex64 = "43361affedeb75affee9baec7e054a5e14883213e5a121b67d74a0e12e9d2b7a"

// TestValidateStrictRules has one row per rule that this Coordinator adds to
// MarbleRun's (docs/manifest-validation.md), each a mutation of
// testdata/manifest.json.
func TestValidateStrictRules(t *testing.T) {
	long := strings.Repeat("n", MaxNameLength+1)
	longQuoted := `"` + strings.Repeat("n", 64) + `"…`
	tests := []ruleRow{
		// Names of entries.
		{"empty package name", func(m *Manifest) { m.Packages[""] = Package{Debug: true} },
			"Packages", "", "", `invalid package name "": empty`, ""},
		{"empty infrastructure name", func(m *Manifest) { m.Infrastructures[""] = Infrastructure{} },
			"Infrastructures", "", "", `invalid infrastructure name "": empty`, ""},
		{"control character in marble name", func(m *Manifest) { m.Marbles["a\nb"] = Marble{Package: "debug"} },
			"Marbles", "a\nb", "", `invalid marble name "a\nb": contains the control character U+000A`, ""},
		{"DEL in secret name", func(m *Manifest) { m.Secrets["k\x7f"] = Secret{Type: SecretTypePlain, UserDefined: true} },
			"Secrets", "k\x7f", "", `invalid secret name "k\x7f": contains the control character U+007F`, ""},
		{"C1 control in user name", func(m *Manifest) { m.Users["x\u0085"] = User{Certificate: "x"} },
			"Users", "x\u0085", "", `invalid user name "x\u0085": contains the control character U+0085`, ""},
		{"NUL in role name", func(m *Manifest) { m.Roles["r\x00"] = Role{ResourceType: ResourceManifest} },
			"Roles", "r\x00", "", `invalid role name "r\x00": contains the control character U+0000`, ""},
		{"long recovery key name", func(m *Manifest) { m.RecoveryKeys[long] = m.RecoveryKeys["recoveryKey1"] },
			"RecoveryKeys", long, "", `invalid recovery key name ` + longQuoted + `: 257 bytes, more than 256`, ""},
		{"invalid UTF-8 in TLS tag", func(m *Manifest) { m.TLS["t\xff"] = TLSTag{} },
			"TLS", "t\xff", "", `invalid TLS tag name "t\xff": not valid UTF-8`, ""},
		{"names before MarbleRun's rules", func(m *Manifest) { m.Marbles[""] = Marble{Package: "nope"} },
			"Marbles", "", "", `invalid marble name "": empty`, ""},

		// Package values.
		{"SignerID too short", func(m *Manifest) { setPackage(m, "backend", func(p *Package) { p.SignerID = "ab" }) },
			"Packages", "backend", "SignerID", `invalid SignerID in package backend: want 64 hexadecimal digits (32 bytes), got "ab"`, ""},
		{"SignerID not hex", func(m *Manifest) { setPackage(m, "backend", func(p *Package) { p.SignerID = "zz" + hex64[2:] }) },
			"Packages", "backend", "SignerID", `invalid SignerID in package backend: want 64 hexadecimal digits (32 bytes), got "zz` + hex64[2:] + `"`, ""},
		{"SignerID with a 0x prefix", func(m *Manifest) { setPackage(m, "backend", func(p *Package) { p.SignerID = "0x" + hex64 }) },
			"Packages", "backend", "SignerID", `invalid SignerID in package backend: want 64 hexadecimal digits (32 bytes), got "0x` + hex64[:62] + `"…`, ""},
		{"UniqueID too long", func(m *Manifest) { setPackage(m, "frontend", func(p *Package) { p.UniqueID = hex64 + "00" }) },
			"Packages", "frontend", "UniqueID", `invalid UniqueID in package frontend: want 64 hexadecimal digits (32 bytes), got "` + hex64 + `"…`, ""},
		{"UniqueID of a debug package", func(m *Manifest) { setPackage(m, "debug", func(p *Package) { p.UniqueID = "x" }) },
			"Packages", "debug", "UniqueID", `invalid UniqueID in package debug: want 64 hexadecimal digits (32 bytes), got "x"`, ""},
		{"ProductID above 16 bits", func(m *Manifest) { setPackage(m, "backend", func(p *Package) { p.ProductID = ptr[uint64](65536) }) },
			"Packages", "backend", "ProductID", `invalid ProductID in package backend: 65536 is outside the SGX range 0 to 65535`, ""},
		{"huge ProductID", func(m *Manifest) { setPackage(m, "backend", func(p *Package) { p.ProductID = ptr[uint64](1 << 63) }) },
			"Packages", "backend", "ProductID", `invalid ProductID in package backend: 9223372036854775808 is outside the SGX range 0 to 65535`, ""},
		{"SecurityVersion above 16 bits", func(m *Manifest) { setPackage(m, "backend", func(p *Package) { p.SecurityVersion = ptr[uint](70000) }) },
			"Packages", "backend", "SecurityVersion", `invalid SecurityVersion in package backend: 70000 is outside the SGX range 0 to 65535`, ""},
		{"unknown TCB status", func(m *Manifest) {
			setPackage(m, "backend", func(p *Package) { p.AcceptedTCBStatuses = []string{"UpToDate", "Fine"} })
		}, "Packages", "backend", "AcceptedTCBStatuses", `unknown TCB status "Fine" in AcceptedTCBStatuses of package backend: want one of ` + tcbNameList, ""},
		{"TCB status Unknown", func(m *Manifest) {
			setPackage(m, "debug", func(p *Package) { p.AcceptedTCBStatuses = []string{"Unknown"} })
		},
			"Packages", "debug", "AcceptedTCBStatuses", `unknown TCB status "Unknown" in AcceptedTCBStatuses of package debug: want one of ` + tcbNameList, ""},
		{"empty TCB status", func(m *Manifest) { setPackage(m, "backend", func(p *Package) { p.AcceptedTCBStatuses = []string{""} }) },
			"Packages", "backend", "AcceptedTCBStatuses", `unknown TCB status "" in AcceptedTCBStatuses of package backend: want one of ` + tcbNameList, ""},
		{"MarbleRun's package rules first", func(m *Manifest) {
			setPackage(m, "backend", func(p *Package) { p.SignerID, p.ProductID = "ab", nil })
		}, "Packages", "backend", "ProductID", "manifest misses value for ProductID in package backend", ""},

		// Templates that name what is not there.
		{"undefined secret", func(m *Manifest) { setFile(m, "backend_first", "/x", "{{.Secrets.nope.Type}}") },
			"Marbles", "backend_first", "Parameters.Files./x",
			`in Marble backend_first: file /x: template: /x:1:10: at <.Secrets.nope.Type>: secret does not exist: "nope" is not defined in the manifest`, stageTemplateDryRun},
		{"undefined secret in a branch that does not run", func(m *Manifest) {
			setEnv(m, "frontend", "E", File{Data: "{{if false}}\n{{hex .Secrets.nope}}{{end}}"})
		}, "Marbles", "frontend", "Parameters.Env.E",
			`in Marble frontend: env variable E: template: E:2:14: at <.Secrets.nope>: secret does not exist: "nope" is not defined in the manifest`, stageTemplateDryRun},
		{"undefined previous secret", func(m *Manifest) { setFile(m, "frontend", "/p", "{{raw .Previous.Secrets.gone}}") },
			"Marbles", "frontend", "Parameters.Files./p",
			`in Marble frontend: file /p: template: /p:1:15: at <.Previous.Secrets.gone>: secret does not exist: "gone" is not defined in the manifest`, stageTemplateDryRun},
		{"undefined secret through $", func(m *Manifest) { setFile(m, "frontend", "/d", "{{range .Secrets}}{{$.Secrets.nope}}{{end}}") },
			"Marbles", "frontend", "Parameters.Files./d",
			`in Marble frontend: file /d: template: /d:1:21: at <$.Secrets.nope>: secret does not exist: "nope" is not defined in the manifest`, stageTemplateDryRun},
		{"undefined secret through index", func(m *Manifest) { setFile(m, "frontend", "/i", `{{index .Secrets "nope" | raw}}`) },
			"Marbles", "frontend", "Parameters.Files./i",
			`in Marble frontend: file /i: template: /i:1:2: at <index .Secrets "nope">: secret does not exist: "nope" is not defined in the manifest`, stageTemplateDryRun},
		{"undefined secret under a changed dot", func(m *Manifest) { setFile(m, "frontend", "/w", "{{with .Secrets}}{{.nope}}{{end}}") },
			"Marbles", "frontend", "Parameters.Files./w",
			`in Marble frontend: file /w: template: /w:1:19: executing "/w" at <.nope>: map has no entry for key "nope"`, stageTemplateDryRun},
		{"secret names are case-sensitive", func(m *Manifest) { setFile(m, "frontend", "/c", "{{hex .Secrets.SymmetricShared}}") },
			"Marbles", "frontend", "Parameters.Files./c",
			`in Marble frontend: file /c: template: /c:1:14: at <.Secrets.SymmetricShared>: secret does not exist: "SymmetricShared" is not defined in the manifest`, stageTemplateDryRun},
		{"unknown MarbleRun certificate", func(m *Manifest) {
			setFile(m, "frontend", "/m", "{{if true}}{{else}}{{pem .MarbleRun.Root.Cert}}{{end}}")
		},
			"Marbles", "frontend", "Parameters.Files./m",
			`in Marble frontend: file /m: template: /m:1:35: at <.MarbleRun.Root.Cert>: .MarbleRun has no field Root`, stageTemplateDryRun},
		{"unknown secret field", func(m *Manifest) { setFile(m, "frontend", "/f", "{{if false}}{{.Secrets.serverCert.Key}}{{end}}") },
			"Marbles", "frontend", "Parameters.Files./f",
			`in Marble frontend: file /f: template: /f:1:22: at <.Secrets.serverCert.Key>: .Secrets.serverCert has no field Key`, stageTemplateDryRun},
		{"unknown top-level field", func(m *Manifest) { setEnv(m, "frontend", "T", File{Data: "{{if false}}{{.Secret.x}}{{end}}"}) },
			"Marbles", "frontend", "Parameters.Env.T",
			`in Marble frontend: env variable T: template: T:1:21: at <.Secret.x>: the template data has no field Secret`, stageTemplateDryRun},
	}
	runRuleRows(t, tests)
}

// tcbNameList is how the messages list the TCB statuses.
const tcbNameList = "UpToDate, SWHardeningNeeded, ConfigurationNeeded, ConfigurationAndSWHardeningNeeded, OutOfDate, OutOfDateConfigurationNeeded, Revoked"

// TestValidateStrictAccepts lists values at the edge of the added rules.
func TestValidateStrictAccepts(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(m *Manifest)
	}{
		{"longest names", func(m *Manifest) {
			name := strings.Repeat("é", MaxNameLength/2)
			m.Packages[name] = Package{Debug: true}
			m.Marbles[name] = Marble{Package: name}
			m.Secrets[name] = Secret{Type: SecretTypePlain, UserDefined: true}
			m.Roles[name] = Role{ResourceType: ResourceSecrets}
			m.TLS[name] = TLSTag{}
			m.Infrastructures[name] = Infrastructure{}
		}},
		{"names with spaces, punctuation and other scripts", func(m *Manifest) {
			m.Packages["my package/v2 (β)"] = Package{Debug: true}
			m.Secrets["秘密-1.key"] = Secret{Type: SecretTypePlain, UserDefined: true}
		}},
		{"upper-case hex IDs", func(m *Manifest) {
			setPackage(m, "backend", func(p *Package) { p.SignerID = strings.ToUpper(hex64) })
			setPackage(m, "frontend", func(p *Package) { p.UniqueID = strings.ToUpper(hex64[:32]) + hex64[32:] })
		}},
		{"16-bit maxima", func(m *Manifest) {
			setPackage(m, "backend", func(p *Package) { p.ProductID, p.SecurityVersion = ptr[uint64](65535), ptr[uint](65535) })
		}},
		{"zero ProductID and SecurityVersion", func(m *Manifest) {
			setPackage(m, "backend", func(p *Package) { p.ProductID, p.SecurityVersion = ptr[uint64](0), ptr[uint](0) })
		}},
		{"every TCB status in any case", func(m *Manifest) {
			setPackage(m, "backend", func(p *Package) {
				p.AcceptedTCBStatuses = append(strings.Split(tcbNameList, ", "), "swhardeningneeded", "OUTOFDATE")
			})
		}},
		{"debug package with valid IDs", func(m *Manifest) {
			setPackage(m, "debug", func(p *Package) { p.UniqueID, p.SignerID = hex64, hex64 })
		}},
		{"defined secrets through every path", func(m *Manifest) {
			setFile(m, "frontend", "/ok", `{{.Secrets.apiKey.Type}}{{.Previous.Secrets.userKey.Size}}{{range .Secrets}}{{$.Secrets.edCert.Type}}{{end}}`+
				`{{index .Secrets "serverCert" | raw}}{{with .Secrets.serverCert}}{{.ValidFor}}{{else}}{{.Secrets.rsaCert.Type}}{{end}}`)
		}},
		{"fields of the template data", func(m *Manifest) {
			setFile(m, "frontend", "/f", `{{if false}}{{.MarbleRun.RootCA.Cert}}{{.MarbleRun.MarbleCert.Private}}{{.MarbleRun.CoordinatorRoot}}{{.Previous}}{{.Secrets}}{{.}}{{end}}`)
		}},
		{"$ reassigned", func(m *Manifest) {
			setFile(m, "frontend", "/r", `{{$ = .Secrets.serverCert}}{{$.Type}}`)
		}},
		{"a defined template may change its data", func(m *Manifest) {
			setFile(m, "frontend", "/t", `{{define "x"}}{{.Type}}{{end}}{{template "x" .Secrets.serverCert}}`)
		}},
		{"Argv is not a template", func(m *Manifest) {
			setMarble(m, "frontend", func(mb *Marble) { mb.Parameters.Argv = []string{"{{.Secrets.nope}}"} })
		}},
		{"NoTemplates data is not a template", func(m *Manifest) {
			setMarble(m, "frontend", func(mb *Marble) {
				mb.Parameters.Files = map[string]File{"/n": {Data: "{{.Secrets.nope}}", NoTemplates: true}}
			})
		}},
		{"signing quotes is a supported gate", func(m *Manifest) { m.Config.FeatureGates = []string{"signquoteendpoint", "SIGNQUOTEENDPOINT"} }},
		{"monotonic counters are a supported gate", func(m *Manifest) { m.Config.FeatureGates = []string{"SignQuoteEndpoint", "MonotonicCounter"} }},
		{"monotonic counters in any case", func(m *Manifest) { m.Config.FeatureGates = []string{"monotoniccounter", "MONOTONICCOUNTER"} }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := loadFixture(t, "manifest.json")
			tt.mutate(m)
			if err := m.Validate(); err != nil {
				t.Fatalf("Validate: %v", err)
			}
		})
	}
}

// TestRenderKeepsMissingSecrets checks that the stricter dry run does not
// change Render: at activation a missing secret is still "secret does not
// exist" (the Coordinator passes every secret of the manifest).
func TestRenderKeepsMissingSecrets(t *testing.T) {
	p := Parameters{Files: map[string]File{"/f": {Data: "{{if false}}{{.Secrets.nope}}{{end}}ok"}}}
	out, err := p.Render(testTemplateData())
	if err != nil || string(out.Files["/f"]) != "ok" {
		t.Fatalf("Render = %v, %v", out, err)
	}
}

func TestValidatePackageUpdateRange(t *testing.T) {
	current := map[string]Package{"backend": {SignerID: hex64, ProductID: ptr[uint64](1), SecurityVersion: ptr[uint](5)}}
	m := &Manifest{Packages: map[string]Package{"backend": {SecurityVersion: ptr[uint](65536)}}}
	err := m.ValidatePackageUpdate(current)
	var verr *ValidationError
	if !errors.As(err, &verr) || !errors.Is(err, ErrInvalid) {
		t.Fatalf("error %v is not a *ValidationError wrapping ErrInvalid", err)
	}
	want := "update manifest sets SecurityVersion of package backend to 65536, outside the SGX range 0 to 65535"
	if verr.Message != want || verr.Name != "backend" || verr.Field != "SecurityVersion" || verr.Stage() != stageCheckUpdate {
		t.Errorf("got %q (%s/%s/%s), want %q", verr.Message, verr.Name, verr.Field, verr.Stage(), want)
	}
	m.Packages["backend"] = Package{SecurityVersion: ptr[uint](65535)}
	if err := m.ValidatePackageUpdate(current); err != nil {
		t.Errorf("65535: %v", err)
	}
}
