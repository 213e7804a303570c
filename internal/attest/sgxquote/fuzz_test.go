package sgxquote_test

import (
	"bytes"
	"os"
	"testing"

	"github.com/quarry-cc/quarry/internal/attest/dcaptest"
	"github.com/quarry-cc/quarry/internal/attest/sgxquote"
)

func FuzzParseAny(f *testing.F) {
	pl := platform(f)
	for _, v := range []uint16{3, 4, 5} {
		q := pl.Quote(f, dcaptest.QuoteOptions{Version: v})
		f.Add(q)
		f.Add(sgxquote.Wrap(q))
	}
	f.Add(pl.Quote(f, dcaptest.QuoteOptions{CertType: 3, CertData: []byte("encrypted PPID")}))
	b, err := os.ReadFile(dcaptest.SGXTestdata(f, dcaptest.PhalaQuoteFile))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(b)
	f.Fuzz(func(t *testing.T, data []byte) {
		q, err := sgxquote.ParseAny(data)
		if err != nil {
			return
		}
		if n := len(q.SignedData()); n != 432 && n != 438 {
			t.Fatalf("signed data %d bytes", n)
		}
		if !bytes.HasPrefix(q.Raw(), q.SignedData()) {
			t.Fatal("signed data is not a prefix of the quote")
		}
		again, err := sgxquote.ParseAny(sgxquote.Wrap(q.Raw()))
		if err != nil {
			t.Fatalf("re-parse of wrapped quote: %v", err)
		}
		if again.Body != q.Body || again.QEReport != q.QEReport || !bytes.Equal(again.CertData, q.CertData) {
			t.Fatal("re-parse differs")
		}
		_, _ = q.PCKChain()
	})
}
