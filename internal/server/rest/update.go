package rest

import (
	"fmt"
	"net/http"
	"strings"

	v2 "github.com/quarry-cc/quarry/api/v2"
	"github.com/quarry-cc/quarry/internal/core"
)

// readManifestBody decodes {"manifest": base64}. The limit applies to the
// manifest itself: the body may be as large as its base64 form plus a
// little room for the JSON around it.
func (s *server) readManifestBody(r *http.Request) ([]byte, error) {
	var req v2.UpdateRequest
	limit := s.opts.MaxManifestBytes
	if err := decodeBody(r, manifestBodyLimit(limit), &req); err != nil {
		return nil, err
	}
	if len(req.Manifest) == 0 {
		return nil, &bodyError{msg: `invalid request: the "manifest" member is missing or empty; it must hold the base64-encoded manifest`}
	}
	if int64(len(req.Manifest)) > limit {
		return nil, &bodyError{tooLarge: true, msg: fmt.Sprintf("manifest too large: the limit is %d bytes", limit)}
	}
	return req.Manifest, nil
}

// manifestBodyLimit is the largest body of a v2 request carrying a manifest
// of at most limit bytes: its base64 form and room for the JSON around it.
func manifestBodyLimit(limit int64) int64 { return (limit+2)/3*4 + 4096 }

func (s *server) postUpdate(r *http.Request) (any, error) {
	if err := s.authenticate(r, ""); err != nil {
		return nil, err
	}
	raw, err := s.readManifestBody(r)
	if err != nil {
		return nil, err
	}
	res, err := s.c.Update(r.Context(), peerCertificates(r), raw)
	if err != nil {
		return nil, err
	}
	return v2.UpdateResponse{
		MissingAcknowledgments: res.MissingAcknowledgments,
		MissingUsers:           res.MissingUsers,
		RecoverySecrets:        res.RecoverySecrets,
	}, nil
}

// progressMessage is MarbleRun's text for the state of an acknowledgement.
func progressMessage(missing int, users []string) string {
	switch missing {
	case 0:
		return "All users have acknowledged the update manifest. Update successfully applied"
	case 1:
		return "1 user still needs to acknowledge the update manifest.\nThe following users have not yet accepted: " + strings.Join(users, ", ")
	}
	return fmt.Sprintf("%d users still need to acknowledge the update manifest.\nThe following users have not yet accepted: %s", missing, strings.Join(users, ", "))
}

// pendingUpdateData is the pending update as both generations show it.
type pendingUpdateData = v2.PendingUpdateResponse

func (s *server) getPendingUpdate(r *http.Request) (any, error) {
	p, err := s.c.PendingUpdate(r.Context())
	if err != nil {
		return nil, err
	}
	msg := fmt.Sprintf("%d users still need to acknowledge the update manifest", p.MissingAcknowledgments)
	if p.MissingAcknowledgments == 1 {
		msg = "1 user still needs to acknowledge the update manifest"
	}
	return pendingUpdateData{Manifest: p.Manifest, MissingUsers: p.MissingUsers, Message: msg}, nil
}

// ackMessage is the text answer to an acknowledgement.
func ackMessage(res core.UpdateResult) string {
	msg := progressMessage(res.MissingAcknowledgments, res.MissingUsers)
	if res.AlreadyAcknowledged {
		msg = "You have already acknowledged this update; nothing changed.\n" + msg
	}
	return msg
}

const cancelMessage = "Update successfully cancelled"

func (s *server) postAcknowledge(r *http.Request) (any, error) {
	if err := s.authenticate(r, ""); err != nil {
		return nil, err
	}
	raw, err := s.readManifestBody(r)
	if err != nil {
		return nil, err
	}
	res, err := s.c.AcknowledgeUpdate(r.Context(), peerCertificates(r), raw)
	if err != nil {
		return nil, err
	}
	return v2.UpdateAckResponse{
		Message:                ackMessage(res),
		MissingAcknowledgments: res.MissingAcknowledgments,
		MissingUsers:           res.MissingUsers,
		RecoverySecrets:        res.RecoverySecrets,
	}, nil
}

func (s *server) postCancel(r *http.Request) (any, error) {
	if err := s.authenticate(r, ""); err != nil {
		return nil, err
	}
	if err := s.c.CancelUpdate(r.Context(), peerCertificates(r)); err != nil {
		return nil, err
	}
	return v2.UpdateCancelResponse{Message: cancelMessage}, nil
}
