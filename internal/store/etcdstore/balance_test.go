package etcdstore

import (
	"errors"
	"slices"
	"testing"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestReadOnly: only requests that change nothing are sent again.
func TestReadOnly(t *testing.T) {
	rng := &pb.RequestOp{Request: &pb.RequestOp_RequestRange{RequestRange: &pb.RangeRequest{Key: []byte("k")}}}
	put := &pb.RequestOp{Request: &pb.RequestOp_RequestPut{RequestPut: &pb.PutRequest{Key: []byte("k")}}}
	for _, tc := range []struct {
		name string
		req  any
		want bool
	}{
		{"range", &pb.RangeRequest{}, true},
		{"status", &pb.StatusRequest{}, true},
		{"txn of ranges", &pb.TxnRequest{Success: []*pb.RequestOp{rng, rng}}, true},
		{"compare-and-swap", &pb.TxnRequest{Compare: []*pb.Compare{{}}, Success: []*pb.RequestOp{put}}, false},
		{"put on failure", &pb.TxnRequest{Success: []*pb.RequestOp{rng}, Failure: []*pb.RequestOp{put}}, false},
		{"put", &pb.PutRequest{}, false},
		{"delete", &pb.DeleteRangeRequest{}, false},
		{"lease grant", &pb.LeaseGrantRequest{}, false},
	} {
		if got := readOnly(tc.req); got != tc.want {
			t.Errorf("%s: readOnly = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestRetryable: a write is sent again only when a member refused it for
// want of a leader; a read also after a timeout or an unavailable member.
func TestRetryable(t *testing.T) {
	timeout := status.Error(codes.DeadlineExceeded, "context deadline exceeded")
	gone := status.Error(codes.Unavailable, "error reading from server: EOF")
	for _, tc := range []struct {
		name      string
		err       error
		ro, write bool
	}{
		{"no leader", rpctypes.ErrGRPCNoLeader, true, true},
		{"timeout", timeout, true, false},
		{"connection lost", gone, true, false},
		{"request timed out", rpctypes.ErrGRPCTimeout, true, false},
		{"compacted", rpctypes.ErrGRPCCompacted, false, false},
		{"too large", rpctypes.ErrGRPCRequestTooLarge, false, false},
		{"other", errors.New("x"), false, false},
	} {
		if got := retryable(tc.err, true); got != tc.ro {
			t.Errorf("%s: read retryable = %v, want %v", tc.name, got, tc.ro)
		}
		if got := retryable(tc.err, false); got != tc.write {
			t.Errorf("%s: write retryable = %v, want %v", tc.name, got, tc.write)
		}
	}
}

// TestChoose: the client is pointed at the leader of the newest term when
// it answers, else at the members that answer.
func TestChoose(t *testing.T) {
	eps := []string{"a", "b", "c"}
	ok := func(id, leader, term uint64) memberStatus {
		return memberStatus{ok: true, id: id, leader: leader, term: term}
	}
	for _, tc := range []struct {
		name string
		st   []memberStatus
		want []string
	}{
		{"all answer", []memberStatus{ok(1, 2, 5), ok(2, 2, 5), ok(3, 2, 5)}, []string{"b"}},
		{"leader frozen", []memberStatus{ok(1, 2, 5), {}, ok(3, 2, 5)}, []string{"a", "c"}},
		{"election under way", []memberStatus{ok(1, 0, 6), {}, ok(3, 0, 6)}, []string{"a", "c"}},
		{"one knows no leader", []memberStatus{ok(1, 0, 6), ok(2, 3, 6), ok(3, 3, 6)}, []string{"c"}},
		{"a deposed leader thawed", []memberStatus{ok(1, 3, 7), ok(2, 2, 5), ok(3, 3, 7)}, []string{"c"}},
		{"deposed leader, new one silent", []memberStatus{ok(1, 3, 7), ok(2, 2, 5), {}}, []string{"a", "b"}},
		{"nobody answers", []memberStatus{{}, {}, {}}, []string{"a", "b", "c"}},
	} {
		if got := choose(eps, tc.st); !slices.Equal(got, tc.want) {
			t.Errorf("%s: choose = %v, want %v", tc.name, got, tc.want)
		}
	}
}
