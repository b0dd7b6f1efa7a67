package redfish

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"strings"

	"github.com/stmcginnis/gofish/schemas"

	"github.com/outpost-metal/outpost/edge/bmc/internal/scrub"
)

// maxMessage bounds the service's message quoted in an error.
const maxMessage = 300

// StatusError is an answer with an HTTP status other than success.
type StatusError struct {
	// Status is the HTTP status code.
	Status int
	// Message is what the service said (its Redfish error message, scrubbed of the credentials and bounded), or a
	// note that the body was an HTML page.
	Message string
}

// Error says the status in numbers and in words.
func (e *StatusError) Error() string {
	msg := fmt.Sprintf("http status %d (%s)", e.Status, strings.ToLower(http.StatusText(e.Status)))
	if e.Message != "" {
		msg += ": " + e.Message
	}

	return msg
}

// Permanent reports whether the service will give the same answer to the same request: a 4xx status other than
// 408 request timeout, 412 precondition failed and 429 too many requests. 412 answers an If-Match with a stale ETag
// (another client changed the resource in between): the next attempt reads a fresh ETag. 5xx are retryable.
func (e *StatusError) Permanent() bool {
	switch e.Status {
	case http.StatusRequestTimeout, http.StatusPreconditionFailed, http.StatusTooManyRequests:
		return false
	}

	return e.Status >= 400 && e.Status < 500
}

// notJSONError is an HTML page answered with a success status.
type notJSONError struct {
	method, path string
	status       int
	contentType  string
}

func (e *notJSONError) Error() string {
	return fmt.Sprintf("%s %s: %s (http status %d, %s: a web login page or a proxy rather than the redfish service?)",
		e.method, e.path, ErrNotJSON, e.status, e.contentType)
}

func (e *notJSONError) Unwrap() error { return ErrNotJSON }

// Permanent reports true: the endpoint is not a Redfish service.
func (e *notJSONError) Permanent() bool { return true }

// schemaError is an answer whose JSON does not fit the Redfish schema: the same answer will not fit next time.
type schemaError struct{ err *scrub.Error }

func (e schemaError) Error() string { return e.err.Error() }
func (e schemaError) Unwrap() error { return e.err }

// Permanent reports true.
func (schemaError) Permanent() bool { return true }

// htmlGuard turns an HTML page answered with a success status into a *notJSONError before gofish tries to decode
// it. Failing statuses pass through: gofish reads their bodies itself (and acts on some, such as 412).
type htmlGuard struct{ next http.RoundTripper }

// RoundTrip implements http.RoundTripper.
func (g htmlGuard) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := g.next.RoundTrip(req)
	if err != nil || resp.StatusCode < 200 || resp.StatusCode > 299 {
		return resp, err
	}

	ct := resp.Header.Get("Content-Type")

	if ct == "" {
		// No type given: sniff the start of the body and keep it for the reader.
		br := bufio.NewReader(resp.Body)
		head, _ := br.Peek(512) //nolint:errcheck // a short body is fine
		ct = http.DetectContentType(head)
		resp.Body = struct {
			io.Reader
			io.Closer
		}{br, resp.Body}

		if len(head) == 0 {
			return resp, nil
		}
	}

	if mt, _, _ := mime.ParseMediaType(ct); mt != "text/html" && mt != "application/xhtml+xml" {
		return resp, nil
	}

	resp.Body.Close() //nolint:errcheck

	return nil, &notJSONError{method: req.Method, path: req.URL.Path, status: resp.StatusCode, contentType: ct}
}

// classify turns a gofish or net/http error into this package's (see the package comment).
func classify(err error, secrets []string) error {
	var (
		nj *notJSONError
		se *schemas.Error
		ne net.Error
		te *json.UnmarshalTypeError
		sy *json.SyntaxError
	)

	switch {
	case errors.As(err, &nj):
		return nj
	case errors.Is(err, context.Canceled):
		return scrub.NewError(err, context.Canceled, secrets...)
	case errors.As(err, &se) && se.HTTPReturnedStatusCode != 0:
		return &StatusError{Status: se.HTTPReturnedStatusCode, Message: serviceMessage(se, secrets)}
	case errors.As(err, &ne) && ne.Timeout():
		return scrub.NewError(err, ErrNoAnswer, secrets...)
	case errors.As(err, &te):
		return schemaError{scrub.NewError(err, ErrMalformedReply, secrets...)}
	case errors.As(err, &sy), errors.Is(err, io.ErrUnexpectedEOF):
		return scrub.NewError(err, ErrMalformedReply, secrets...)
	}

	return scrub.NewError(err, nil, secrets...)
}

// serviceMessage is what a failing answer said, for an error: the Redfish error's message and those of its
// extended info, or a note that the body is an HTML page; scrubbed and bounded.
func serviceMessage(se *schemas.Error, secrets []string) string {
	parts := []string{se.Message}

	for _, info := range se.ExtendedInfos {
		if info.Message != "" && info.Message != se.Message {
			parts = append(parts, info.Message)
		}
	}

	msg := strings.TrimSpace(strings.Join(parts, "; "))

	if strings.HasPrefix(strings.ToLower(msg), "<!doctype html") || strings.HasPrefix(strings.ToLower(msg), "<html") {
		return "an html page, not a redfish error"
	}

	msg = scrub.Text(msg, secrets...)

	if len(msg) > maxMessage {
		msg = strings.ToValidUTF8(msg[:maxMessage], "") + "..."
	}

	return msg
}
