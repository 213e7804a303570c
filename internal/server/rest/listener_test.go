package rest

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestRawAnswer(t *testing.T) {
	for _, v1 := range []bool{false, true} {
		raw := rawAnswer(errNotTLS, v1)
		resp, err := http.ReadResponse(bufio.NewReader(bytes.NewReader(raw)), nil)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		want := `{"status":"fail","data":null,"message":"` + errNotTLS.msg + `"}` + "\n"
		if v1 {
			want = `{"Status":"error","Data":null,"Message":"` + errNotTLS.msg + `"}` + "\n"
		}
		if resp.StatusCode != 400 || !resp.Close || resp.Header.Get("Content-Type") != "application/json" || string(body) != want {
			t.Errorf("v1=%v: %q", v1, raw)
		}
	}
}

// TestGuardPlainHTTP: behind the guard, TLS is served as before and plain
// HTTP gets the JSend answer.
func TestGuardPlainHTTP(t *testing.T) {
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "tls") }))
	srv.Listener = GuardPlainHTTP(srv.Listener)
	srv.StartTLS()
	defer srv.Close()
	resp, err := srv.Client().Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(body) != "tls" {
		t.Fatalf("over TLS: %q", body)
	}
	conn, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	io.WriteString(conn, "GET /api/v2/status HTTP/1.1\r\nHost: x\r\n\r\n")
	resp, err = http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ = io.ReadAll(resp.Body)
	if resp.StatusCode != 400 || !strings.Contains(string(body), `"status":"fail"`) {
		t.Fatalf("plain HTTP: %d %q", resp.StatusCode, body)
	}
}

func TestCleanPath(t *testing.T) {
	for p, want := range map[string]string{
		"/api/v2/status":  "/api/v2/status",
		"/api/v2/status/": "/api/v2/status/",
		"//api/v2/status": "/api/v2/status",
		"/api/./status":   "/api/status",
		"/a/b/../c":       "/a/c",
		"/a//":            "/a/",
		"*":               "/*",
		"":                "/",
	} {
		if got := cleanPath(p); got != want {
			t.Errorf("cleanPath(%q) = %q, want %q", p, got, want)
		}
	}
}
