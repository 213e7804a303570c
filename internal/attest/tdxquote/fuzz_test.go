package tdxquote_test

import (
	"bytes"
	"os"
	"testing"

	"github.com/quarry-cc/quarry/internal/attest/dcaptest"
	"github.com/quarry-cc/quarry/internal/attest/tdxquote"
)

func FuzzParse(f *testing.F) {
	pl := dcaptest.NewPKI(f).NewPlatform(f, dcaptest.DefaultExtension())
	f.Add(pl.TDXQuote(f, dcaptest.TDXQuoteOptions{}))
	f.Add(pl.TDXQuote(f, dcaptest.TDXQuoteOptions{Version: 5}))
	f.Add(pl.TDXQuote(f, dcaptest.TDXQuoteOptions{Version: 5, BodyType: tdxquote.BodyTypeTD15}))
	for _, name := range []string{dcaptest.TDXQuoteA, dcaptest.TDXQuoteB, dcaptest.TDXQuoteC} {
		b, err := os.ReadFile(dcaptest.TDXTestdata(f, name))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		q, err := tdxquote.Parse(data)
		if err != nil {
			return
		}
		if n := len(q.SignedData()); n != 632 && n != 638 && n != 702 {
			t.Fatalf("signed data %d bytes", n)
		}
		if !bytes.HasPrefix(q.Raw(), q.SignedData()) || !bytes.HasPrefix(data, q.Raw()) || len(q.Raw())+q.Padding != len(data) {
			t.Fatal("raw, signed data and padding do not add up")
		}
		body := q.Body.Marshal(q.BodyType)
		if !bytes.HasSuffix(q.SignedData(), body) {
			t.Fatal("body does not re-marshal to the signed bytes")
		}
		again, err := tdxquote.Parse(q.Raw())
		if err != nil || again.Body != q.Body || again.QEReport != q.QEReport || !bytes.Equal(again.CertData, q.CertData) {
			t.Fatalf("re-parse differs: %v", err)
		}
		_, _ = q.PCKChain()
	})
}
