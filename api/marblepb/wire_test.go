package marblepb_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"net"
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/quarry-cc/quarry/api/marblepb"
)

// The vectors below are protobuf wire bytes written by hand from the field
// numbers and types of MarbleRun's coordinator/rpc/coordinator.proto, so they
// check our generated code against the wire format rather than against
// itself. Every field here is length-delimited (wire type 2), so its tag byte
// is field<<3|2: 1 -> 0x0a, 2 -> 0x12, 3 -> 0x1a, 4 -> 0x22. A map field is a
// repeated message whose entries have the key as field 1 and the value as
// field 2.

// ld encodes one length-delimited field: tag byte, varint length, payload.
func ld(tag byte, payload ...[]byte) []byte {
	p := bytes.Join(payload, nil)
	b := append([]byte{tag}, binary.AppendUvarint(nil, uint64(len(p)))...)
	return append(b, p...)
}

func cat(parts ...[]byte) []byte { return bytes.Join(parts, nil) }

var (
	// A quote longer than 127 bytes, so that its length takes two varint bytes.
	quote = bytes.Repeat([]byte("q"), 300)
	csr   = []byte{0x30, 0x82, 0x01, 0x0a, 0x00, 0xff} // not valid DER; any bytes go
	uuid  = "d4a7b1c2-3e4f-4a5b-8c6d-7e8f9a0b1c2d"
)

// activationReqWire is ActivationReq{Quote: quote, CSR: csr,
// MarbleType: "backend", UUID: uuid}, fields in number order as a
// marshaller writes them.
var activationReqWire = cat(
	[]byte{0x0a, 0xac, 0x02}, quote, // field 1 Quote, length 300 = varint ac 02
	[]byte{0x12, 0x06}, csr, // field 2 CSR, length 6
	[]byte{0x1a, 0x07}, []byte("backend"), // field 3 MarbleType
	[]byte{0x22, 0x24}, []byte(uuid), // field 4 UUID, length 36
)

func TestActivationReqWire(t *testing.T) {
	if !bytes.Equal(ld(0x0a, quote)[:3], []byte{0x0a, 0xac, 0x02}) {
		t.Fatal("ld helper: wrong varint length") // guards the helper used below
	}
	want := &marblepb.ActivationReq{Quote: quote, CSR: csr, MarbleType: "backend", UUID: uuid}

	tests := []struct {
		name string
		wire []byte
	}{
		{"fields in number order", activationReqWire},
		{"fields in reverse order", cat(
			ld(0x22, []byte(uuid)), ld(0x1a, []byte("backend")), ld(0x12, csr), ld(0x0a, quote))},
		{"unknown field from a newer peer is skipped", cat(
			activationReqWire, ld(0x2a, []byte("field 5")), []byte{0x30, 0x01})}, // 5: bytes, 6: varint
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got marblepb.ActivationReq
			if err := proto.Unmarshal(tt.wire, &got); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got.GetQuote(), quote) {
				t.Errorf("Quote = %q, want %d bytes of q", got.GetQuote(), len(quote))
			}
			if !bytes.Equal(got.GetCSR(), csr) {
				t.Errorf("CSR = %x, want %x", got.GetCSR(), csr)
			}
			if got.GetMarbleType() != "backend" {
				t.Errorf("MarbleType = %q, want %q", got.GetMarbleType(), "backend")
			}
			if got.GetUUID() != uuid {
				t.Errorf("UUID = %q, want %q", got.GetUUID(), uuid)
			}
			// Compare via proto.Equal too, ignoring the unknown fields kept by the parser.
			got.ProtoReflect().SetUnknown(nil)
			if !proto.Equal(&got, want) {
				t.Errorf("got %v, want %v", &got, want)
			}
		})
	}

	out, err := proto.MarshalOptions{Deterministic: true}.Marshal(want)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(out, activationReqWire) {
		t.Errorf("Marshal:\n got % x\nwant % x", out, activationReqWire)
	}
}

func TestActivationReqEmpty(t *testing.T) {
	// A Marble in simulation mode sends an empty quote. proto3 fields without
	// presence are not written when empty, so an empty quote is no bytes.
	req := &marblepb.ActivationReq{MarbleType: "backend", UUID: uuid}
	out, err := proto.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	want := cat([]byte{0x1a, 0x07}, []byte("backend"), []byte{0x22, 0x24}, []byte(uuid))
	if !bytes.Equal(out, want) {
		t.Errorf("Marshal:\n got % x\nwant % x", out, want)
	}
	// An explicit empty Quote field on the wire reads the same as none.
	var got marblepb.ActivationReq
	if err := proto.Unmarshal(cat([]byte{0x0a, 0x00}, want), &got); err != nil {
		t.Fatal(err)
	}
	if len(got.GetQuote()) != 0 || got.GetMarbleType() != "backend" {
		t.Errorf("got %v", &got)
	}
}

// mapEntry is one entry of a map<string, bytes> field: key = 1, value = 2.
func mapEntry(tag byte, key, value string) []byte {
	return ld(tag, ld(0x0a, []byte(key)), ld(0x12, []byte(value)))
}

// parametersWire holds two Files, two Env entries and three Argv strings.
// Map entries are in key order, as a deterministic marshaller writes them.
var parametersWire = cat(
	mapEntry(0x0a, "/dev/attestation/protected_files_key", "\x00\x01\x02"), // field 1 Files
	mapEntry(0x0a, "/etc/app/config.json", `{"port":8080}`),
	mapEntry(0x12, "MARBLE_PREDEFINED_ROOT_CA", "-----BEGIN CERTIFICATE-----\n"), // field 2 Env
	mapEntry(0x12, "ZZ_EMPTY", ""),
	ld(0x1a, []byte("./marble")), // field 3 Argv, one field per element, in order
	ld(0x1a, []byte("serve")),
	ld(0x1a, []byte("")),
)

func TestActivationRespWire(t *testing.T) {
	// Spot-check the helpers against bytes written out in full.
	if got, want := mapEntry(0x12, "K", "vv"), []byte{0x12, 0x07, 0x0a, 0x01, 'K', 0x12, 0x02, 'v', 'v'}; !bytes.Equal(got, want) {
		t.Fatalf("mapEntry = % x, want % x", got, want)
	}
	wire := ld(0x0a, parametersWire) // ActivationResp field 1 Parameters

	want := &marblepb.ActivationResp{Parameters: &marblepb.Parameters{
		Files: map[string][]byte{
			"/dev/attestation/protected_files_key": {0x00, 0x01, 0x02},
			"/etc/app/config.json":                 []byte(`{"port":8080}`),
		},
		Env: map[string][]byte{
			"MARBLE_PREDEFINED_ROOT_CA": []byte("-----BEGIN CERTIFICATE-----\n"),
			"ZZ_EMPTY":                  {},
		},
		Argv: []string{"./marble", "serve", ""},
	}}

	var got marblepb.ActivationResp
	if err := proto.Unmarshal(wire, &got); err != nil {
		t.Fatal(err)
	}
	p := got.GetParameters()
	if p == nil {
		t.Fatal("Parameters is nil")
	}
	checkMap(t, "Files", p.GetFiles(), want.Parameters.Files)
	checkMap(t, "Env", p.GetEnv(), want.Parameters.Env)
	if !slices.Equal(p.GetArgv(), want.Parameters.Argv) {
		t.Errorf("Argv = %q, want %q", p.GetArgv(), want.Parameters.Argv)
	}

	out, err := proto.MarshalOptions{Deterministic: true}.Marshal(want)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(out, wire) {
		t.Errorf("Marshal:\n got % x\nwant % x", out, wire)
	}
}

func TestActivationRespMapEntries(t *testing.T) {
	tests := []struct {
		name      string
		entry     []byte // the payload of one Files entry
		wantKey   string
		wantValue string
	}{
		{"value before key", cat(ld(0x12, []byte("v")), ld(0x0a, []byte("k"))), "k", "v"},
		{"missing value is empty", ld(0x0a, []byte("k")), "k", ""},
		{"missing key is the empty key", ld(0x12, []byte("v")), "", "v"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got marblepb.ActivationResp
			if err := proto.Unmarshal(ld(0x0a, ld(0x0a, tt.entry)), &got); err != nil {
				t.Fatal(err)
			}
			checkMap(t, "Files", got.GetParameters().GetFiles(), map[string][]byte{tt.wantKey: []byte(tt.wantValue)})
		})
	}

	// A repeated key: the last entry wins.
	var got marblepb.Parameters
	if err := proto.Unmarshal(cat(mapEntry(0x12, "A", "1"), mapEntry(0x12, "A", "2")), &got); err != nil {
		t.Fatal(err)
	}
	checkMap(t, "Env", got.GetEnv(), map[string][]byte{"A": []byte("2")})

	// Parameters present but empty is written as an empty message, and read
	// back as present.
	empty := &marblepb.ActivationResp{Parameters: &marblepb.Parameters{}}
	out, err := proto.Marshal(empty)
	if err != nil {
		t.Fatal(err)
	}
	if want := []byte{0x0a, 0x00}; !bytes.Equal(out, want) {
		t.Errorf("Marshal(empty Parameters) = % x, want % x", out, want)
	}
	var resp marblepb.ActivationResp
	if err := proto.Unmarshal([]byte{0x0a, 0x00}, &resp); err != nil || resp.GetParameters() == nil {
		t.Errorf("Unmarshal(0a 00) = %v, %v; want empty, non-nil Parameters", &resp, err)
	}
}

func checkMap(t *testing.T, field string, got, want map[string][]byte) {
	t.Helper()
	if len(got) != len(want) {
		t.Errorf("%s has %d entries, want %d: %q", field, len(got), len(want), got)
	}
	for k, w := range want {
		g, ok := got[k]
		if !ok {
			t.Errorf("%s[%q] missing", field, k)
		} else if !bytes.Equal(g, w) {
			t.Errorf("%s[%q] = %q, want %q", field, k, g, w)
		}
	}
}

// TestDescriptor pins what the generated code says about itself: the names
// that reach the wire (package, service, method) and each field's number,
// kind and cardinality.
func TestDescriptor(t *testing.T) {
	if marblepb.Marble_Activate_FullMethodName != "/rpc.Marble/Activate" {
		t.Errorf("full method name = %q", marblepb.Marble_Activate_FullMethodName)
	}
	sd := marblepb.Marble_ServiceDesc
	if sd.ServiceName != "rpc.Marble" || len(sd.Methods) != 1 || sd.Methods[0].MethodName != "Activate" || len(sd.Streams) != 0 {
		t.Errorf("service desc = %q %+v streams %d, want rpc.Marble with one unary method Activate", sd.ServiceName, sd.Methods, len(sd.Streams))
	}

	fd := marblepb.File_api_marblepb_marble_proto
	if fd.Package() != "rpc" || fd.Syntax() != protoreflect.Proto3 {
		t.Errorf("file: package %q syntax %v, want rpc proto3", fd.Package(), fd.Syntax())
	}
	svc := fd.Services().ByName("Marble")
	if svc == nil || svc.FullName() != "rpc.Marble" || svc.Methods().Len() != 1 {
		t.Fatalf("service Marble = %v", svc)
	}
	m := svc.Methods().ByName("Activate")
	if m == nil || m.IsStreamingClient() || m.IsStreamingServer() ||
		m.Input().FullName() != "rpc.ActivationReq" || m.Output().FullName() != "rpc.ActivationResp" {
		t.Fatalf("method Activate = %v", m)
	}

	type field struct {
		msg, name     string
		number        protoreflect.FieldNumber
		kind          protoreflect.Kind // for a map: the value's kind
		isList, isMap bool
	}
	fields := []field{
		{"ActivationReq", "Quote", 1, protoreflect.BytesKind, false, false},
		{"ActivationReq", "CSR", 2, protoreflect.BytesKind, false, false},
		{"ActivationReq", "MarbleType", 3, protoreflect.StringKind, false, false},
		{"ActivationReq", "UUID", 4, protoreflect.StringKind, false, false},
		{"ActivationResp", "Parameters", 1, protoreflect.MessageKind, false, false},
		{"Parameters", "Files", 1, protoreflect.BytesKind, false, true},
		{"Parameters", "Env", 2, protoreflect.BytesKind, false, true},
		{"Parameters", "Argv", 3, protoreflect.StringKind, true, false},
	}
	count := map[string]int{}
	for _, f := range fields {
		count[f.msg]++
		md := fd.Messages().ByName(protoreflect.Name(f.msg))
		if md == nil {
			t.Fatalf("message %s missing", f.msg)
		}
		d := md.Fields().ByName(protoreflect.Name(f.name))
		if d == nil {
			t.Errorf("%s.%s missing", f.msg, f.name)
			continue
		}
		kind := d.Kind()
		if d.IsMap() {
			if d.MapKey().Kind() != protoreflect.StringKind {
				t.Errorf("%s.%s: map key kind %v, want string", f.msg, f.name, d.MapKey().Kind())
			}
			kind = d.MapValue().Kind()
		}
		if d.Number() != f.number || kind != f.kind || d.IsList() != f.isList || d.IsMap() != f.isMap || d.HasPresence() != (f.kind == protoreflect.MessageKind) {
			t.Errorf("%s.%s = number %d kind %v list %v map %v presence %v, want %+v",
				f.msg, f.name, d.Number(), kind, d.IsList(), d.IsMap(), d.HasPresence(), f)
		}
	}
	for msg, n := range count {
		if got := fd.Messages().ByName(protoreflect.Name(msg)).Fields().Len(); got != n {
			t.Errorf("%s has %d fields, want %d", msg, got, n)
		}
	}
	if fd.Messages().Len() != len(count) {
		t.Errorf("file has %d messages, want %d", fd.Messages().Len(), len(count))
	}
}

// fakeMarbleServer answers Activate with the request's fields echoed into
// Env, so that a round trip shows both directions.
type fakeMarbleServer struct {
	marblepb.UnimplementedMarbleServer
}

var _ marblepb.MarbleServer = fakeMarbleServer{}

func (fakeMarbleServer) Activate(_ context.Context, req *marblepb.ActivationReq) (*marblepb.ActivationResp, error) {
	return &marblepb.ActivationResp{Parameters: &marblepb.Parameters{
		Env:  map[string][]byte{"TYPE": []byte(req.GetMarbleType()), "UUID": []byte(req.GetUUID())},
		Argv: []string{strings.ToUpper(req.GetMarbleType())},
	}}, nil
}

// TestActivateOverGRPC calls the service through a connection by the literal
// method name a MarbleRun Marble uses, not through the generated client.
func TestActivateOverGRPC(t *testing.T) {
	lis := bufconn.Listen(1 << 20)
	srv := grpc.NewServer()
	marblepb.RegisterMarbleServer(srv, fakeMarbleServer{})
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)

	conn, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })

	var resp marblepb.ActivationResp
	req := &marblepb.ActivationReq{MarbleType: "backend", UUID: uuid}
	if err := conn.Invoke(t.Context(), "/rpc.Marble/Activate", req, &resp); err != nil {
		t.Fatal(err)
	}
	p := resp.GetParameters()
	if string(p.GetEnv()["TYPE"]) != "backend" || string(p.GetEnv()["UUID"]) != uuid || !slices.Equal(p.GetArgv(), []string{"BACKEND"}) {
		t.Errorf("response = %v", &resp)
	}
}
