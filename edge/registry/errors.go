package registry

import (
	"encoding/json"
	"net/http"
)

// Error codes of the OCI distribution spec (v1.1, "Error Codes"), and UNKNOWN for a failure of the edge
// itself, as the reference registry (distribution/distribution) answers.
const (
	codeBlobUnknown     = "BLOB_UNKNOWN"
	codeDigestInvalid   = "DIGEST_INVALID"
	codeManifestUnknown = "MANIFEST_UNKNOWN"
	codeNameInvalid     = "NAME_INVALID"
	codeNameUnknown     = "NAME_UNKNOWN"
	codeUnsupported     = "UNSUPPORTED"
	codeTooManyRequests = "TOOMANYREQUESTS"
	codeUnknown         = "UNKNOWN"
)

// specError is one entry of the spec's error body.
type specError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// writeError answers with the spec's error body: {"errors":[{"code":...,"message":...}]}.
func writeError(w http.ResponseWriter, status int, code, message string) {
	body, err := json.Marshal(struct {
		Errors []specError `json:"errors"`
	}{Errors: []specError{{Code: code, Message: message}}})
	if err != nil { // a struct of strings always encodes
		body = []byte(`{"errors":[{"code":"UNKNOWN","message":"internal error"}]}`)
	}

	body = append(body, '\n')

	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	w.Write(body) //nolint:errcheck // the client went away
}
