package cli

import (
	"debug/elf"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/quarry-cc/quarry/internal/attest/sigstruct"
)

// occlumLibOS is where an Occlum instance keeps its signed LibOS enclave.
const occlumLibOS = "build/lib/libocclum-libos.signed.so"

// packageInfo is the output of package-info: the manifest package values.
type packageInfo struct {
	Path            string `json:"path"`
	Kind            string `json:"kind"` // ego (Open Enclave), sgx-sdk, gramine, occlum, sigstruct
	UniqueID        string `json:"UniqueID"`
	SignerID        string `json:"SignerID"`
	ProductID       uint16 `json:"ProductID"`
	SecurityVersion uint16 `json:"SecurityVersion"`
	SignatureValid  bool   `json:"signatureValid"`
}

func (a *app) packageInfoCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "package-info PATH",
		Short: "Print an enclave's package properties (UniqueID, SignerID, ProductID, SecurityVersion) from its SIGSTRUCT",
		Long: `Print the values of a manifest package for an SGX enclave, read from its
signature structure (SIGSTRUCT): UniqueID (MRENCLAVE), SignerID (MRSIGNER, the
SHA-256 of the signing key's modulus), ProductID (ISVPRODID) and
SecurityVersion (ISVSVN). PATH is one of:
  an EGo or Open Enclave binary   (the SIGSTRUCT in its .oeinfo section)
  an Intel SGX SDK enclave        (the SIGSTRUCT in its .note.sgxmeta section)
  a Gramine .sig file, or a Gramine instance directory holding exactly one
  an Occlum instance directory    (` + occlumLibOS + `)
The SIGSTRUCT's RSA signature is checked: if it does not verify with its own
key, the enclave is not validly signed and a warning says so.`,
		Args: exactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			path := args[0]
			info, detected, err := readPackageInfo(path)
			if err != nil {
				return err
			}
			if !info.SignatureValid {
				a.warn(fmt.Sprintf("%s: %v: the enclave is not validly signed, and it cannot run with these values", path, sigstruct.ErrSignature))
			}
			if a.jsonOutput() {
				return a.printJSON(info)
			}
			if detected != "" {
				a.printf("Detected %s.\n", detected)
				a.printf("PackageProperties for %s at '%s':\n", detected, path)
			} else {
				a.printf("PackageProperties for '%s':\n", path)
			}
			a.printf("UniqueID (MRENCLAVE)      : %s\n", info.UniqueID)
			a.printf("SignerID (MRSIGNER)       : %s\n", info.SignerID)
			a.printf("ProductID (ISVPRODID)     : %d\n", info.ProductID)
			a.printf("SecurityVersion (ISVSVN)  : %d\n", info.SecurityVersion)
			return nil
		},
	}
}

// readPackageInfo finds the SIGSTRUCT of path; detected names a directory's
// kind ("Gramine instance", "Occlum image"), "" for a file.
func readPackageInfo(path string) (info packageInfo, detected string, err error) {
	fi, err := os.Stat(path)
	if err != nil {
		return info, "", usageError{err}
	}
	var s *sigstruct.SigStruct
	if fi.IsDir() {
		s, info.Kind, detected, err = sigstructInDir(path)
	} else {
		s, info.Kind, err = sigstructInFile(path)
	}
	if err != nil {
		return info, "", usagef("%s: %w", path, err)
	}
	info.Path = path
	info.UniqueID = hex.EncodeToString(s.MRENCLAVE[:])
	info.SignerID = hex.EncodeToString(s.MRSIGNER[:])
	info.ProductID, info.SecurityVersion = s.ISVProdID, s.ISVSVN
	info.SignatureValid = s.VerifySignature() == nil
	return info, detected, nil
}

// sigstructInFile reads an enclave binary (ELF) or a file that holds a
// SIGSTRUCT (Gramine's .sig).
func sigstructInFile(path string) (*sigstruct.SigStruct, string, error) {
	f, err := elf.Open(path)
	if err == nil {
		defer f.Close()
		s, section, err := sigstruct.FromELF(f)
		if err != nil {
			return nil, "", fmt.Errorf("not a signed enclave binary: %w", err)
		}
		if section == ".oeinfo" {
			return s, "ego", nil
		}
		return s, "sgx-sdk", nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, "", err
	}
	s, err := sigstruct.Find(data)
	if err != nil {
		return nil, "", fmt.Errorf("neither an enclave binary (ELF) nor a file with a SIGSTRUCT such as Gramine's .sig: %w", err)
	}
	if strings.HasSuffix(path, ".sig") {
		return s, "gramine", nil
	}
	return s, "sigstruct", nil
}

// sigstructInDir reads a Gramine instance (one .sig file) or an Occlum
// instance.
func sigstructInDir(dir string) (s *sigstruct.SigStruct, kind, detected string, err error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, "", "", err
	}
	var sigs []string
	for _, e := range entries {
		if !e.IsDir() && filepath.Ext(e.Name()) == ".sig" {
			sigs = append(sigs, e.Name())
		}
	}
	switch {
	case len(sigs) == 1:
		data, err := os.ReadFile(filepath.Join(dir, sigs[0]))
		if err != nil {
			return nil, "", "", err
		}
		s, err := sigstruct.Find(data)
		if err != nil {
			return nil, "", "", fmt.Errorf("%s: %w", sigs[0], err)
		}
		return s, "gramine", "Gramine instance", nil
	case len(sigs) > 1:
		return nil, "", "", fmt.Errorf("a Gramine instance holds one .sig file, this directory %d (%s): name the file", len(sigs), strings.Join(sigs, ", "))
	}
	f, err := elf.Open(filepath.Join(dir, occlumLibOS))
	if errors.Is(err, os.ErrNotExist) {
		return nil, "", "", errors.New("a directory must be a Gramine instance (one .sig file) or an Occlum instance (" + occlumLibOS + "); or name the .sig file or the enclave binary")
	}
	if err != nil {
		return nil, "", "", fmt.Errorf("%s: %w", occlumLibOS, err)
	}
	defer f.Close()
	if s, _, err = sigstruct.FromELF(f); err != nil {
		return nil, "", "", fmt.Errorf("%s: %w", occlumLibOS, err)
	}
	return s, "occlum", "Occlum image", nil
}
