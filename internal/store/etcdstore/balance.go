package etcdstore

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// How the client gets off a member that stops answering (docs/ha.md,
// "A frozen etcd member"). A member whose process is frozen (SIGSTOP, a
// hung machine, a long pause) keeps its sockets open: connections to it
// succeed and requests sent over them wait forever. gRPC's keepalive would
// notice, but not before 10 s (grpc-go's lowest ping interval). So:
//
//   - every request asks for a member with a leader (etcd's require-leader
//     metadata): a member cut off from the quorum refuses at once, and
//     since it refuses before it proposes anything, any request, a write
//     too, is sent again;
//   - a read gets a deadline per attempt (attemptTimeout, doubled on each
//     attempt) and is sent again when it runs out: a read changes nothing,
//     so sending it twice is safe. A write is never sent twice (its
//     outcome after a lost answer is the caller's to find out);
//   - requests wait for a connection that is ready instead of failing at
//     once while the client changes members;
//   - a selector asks every member for its status every probeEvery, each
//     answer due within probeTimeout, and points the client at the leader
//     that answers (the one member every request depends on anyway), else
//     at the members that answer. A frozen or dead follower then gets no
//     requests at all; a frozen leader is left within one probe, and the
//     requests wait for the new leader (an election timeout).

const (
	attemptTimeout = 500 * time.Millisecond
	probeEvery     = 250 * time.Millisecond
	probeTimeout   = 500 * time.Millisecond
)

type ctxKey int

const (
	// failFastKey marks Connect's own check: one attempt, no waiting for
	// a ready connection, so that an unreachable etcd is named at once.
	failFastKey ctxKey = iota
	// probeKey marks the selector's status requests: sent as they are.
	probeKey
)

// readOnly reports whether req changes nothing in etcd, so that sending it
// again is safe.
func readOnly(req any) bool {
	switch r := req.(type) {
	case *pb.RangeRequest, *pb.StatusRequest:
		return true
	case *pb.TxnRequest:
		for _, ops := range [][]*pb.RequestOp{r.Success, r.Failure} {
			for _, op := range ops {
				if op.GetRequestRange() == nil {
					return false
				}
			}
		}
		return true
	}
	return false
}

// retryable reports whether a failed attempt of a request may be sent
// again: any request that a member refused for want of a leader (it was
// not proposed), and a read that ran out of its attempt's time or found no
// member to answer it.
func retryable(err error, ro bool) bool {
	if errors.Is(rpctypes.Error(err), rpctypes.ErrNoLeader) {
		return true
	}
	if !ro {
		return false
	}
	switch status.Code(err) {
	case codes.DeadlineExceeded, codes.Unavailable, codes.Canceled:
		return true
	}
	return false
}

// unaryInterceptor applies the rules above to every unary request.
func unaryInterceptor(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	if ctx.Value(probeKey) != nil {
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	ctx = clientv3.WithRequireLeader(ctx)
	if ctx.Value(failFastKey) != nil {
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	opts = append(opts, grpc.WaitForReady(true))
	ro := readOnly(req)
	wait, perAttempt := 10*time.Millisecond, attemptTimeout
	for {
		actx, cancel := ctx, context.CancelFunc(func() {})
		if ro {
			actx, cancel = context.WithTimeout(ctx, perAttempt)
			perAttempt *= 2
		}
		err := invoker(actx, method, req, reply, cc, opts...)
		cancel()
		if err == nil || ctx.Err() != nil || !retryable(err, ro) {
			return err
		}
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return err
		}
		wait = min(2*wait, 200*time.Millisecond)
	}
}

// streamInterceptor asks for a member with a leader on every watch, so
// that a member cut off from the quorum ends it (and the watcher starts
// again elsewhere) instead of keeping it silent.
func streamInterceptor(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	if method == "/etcdserverpb.Watch/Watch" {
		ctx = clientv3.WithRequireLeader(ctx)
	}
	return streamer(ctx, desc, cc, method, opts...)
}

// selector points cli at the members that answer, the leader alone when
// it does. It runs until cli is closed.
type selector struct {
	cli       *clientv3.Client
	endpoints []string
	conns     []*grpc.ClientConn
	current   []string
	// onChange, if set, is called with each new choice (tests).
	onChange func([]string)
}

// status is one member's answer to a probe.
type memberStatus struct {
	ok               bool
	id, leader, term uint64
}

func (s *selector) run() {
	ctx := s.cli.Ctx()
	defer func() {
		for _, c := range s.conns {
			if c != nil {
				c.Close()
			}
		}
	}()
	t := time.NewTicker(probeEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		choice := choose(s.endpoints, s.probe(ctx))
		if !slices.Equal(choice, s.current) {
			s.current = choice
			s.cli.SetEndpoints(choice...)
			if s.onChange != nil {
				s.onChange(choice)
			}
		}
	}
}

// probe asks every member for its status at once.
func (s *selector) probe(ctx context.Context) []memberStatus {
	out := make([]memberStatus, len(s.endpoints))
	var wg sync.WaitGroup
	for i, ep := range s.endpoints {
		if s.conns[i] == nil {
			c, err := s.cli.Dial(ep)
			if err != nil {
				continue
			}
			s.conns[i] = c
		}
		wg.Go(func() {
			pctx, cancel := context.WithTimeout(context.WithValue(ctx, probeKey, true), probeTimeout)
			defer cancel()
			r, err := pb.NewMaintenanceClient(s.conns[i]).Status(pctx, &pb.StatusRequest{})
			if err != nil || r.Header == nil {
				return
			}
			out[i] = memberStatus{ok: true, id: r.Header.MemberId, leader: r.Leader, term: r.RaftTerm}
		})
	}
	wg.Wait()
	return out
}

// choose returns the endpoints the client should use: the leader of the
// newest term if it answered, else every member that answered and knows a
// leader, else every member that answered, else all.
func choose(endpoints []string, st []memberStatus) []string {
	var term, leader uint64
	for _, m := range st {
		if m.ok && m.leader != 0 && m.term >= term {
			term, leader = m.term, m.leader
		}
	}
	var withLeader, answered []string
	for i, m := range st {
		if !m.ok {
			continue
		}
		answered = append(answered, endpoints[i])
		if m.leader != 0 {
			withLeader = append(withLeader, endpoints[i])
		}
		if leader != 0 && m.id == leader && m.term == term {
			return []string{endpoints[i]}
		}
	}
	switch {
	case len(withLeader) > 0:
		return withLeader
	case len(answered) > 0:
		return answered
	}
	return slices.Clone(endpoints)
}
