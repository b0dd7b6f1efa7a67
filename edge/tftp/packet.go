package tftp

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Opcodes (RFC 1350 section 5; OACK from RFC 2347).
const (
	opRRQ   uint16 = 1
	opWRQ   uint16 = 2
	opDATA  uint16 = 3
	opACK   uint16 = 4
	opERROR uint16 = 5
	opOACK  uint16 = 6
)

// Error codes (RFC 1350 appendix; 8 from RFC 2347).
const (
	errNotDefined      uint16 = 0
	errFileNotFound    uint16 = 1
	errAccessViolation uint16 = 2
	errIllegalOp       uint16 = 4
)

// Options and their bounds: blksize from RFC 2348 (the edge grants 512 and more only, as it always has),
// tsize from RFC 2349. Others (timeout, windowsize) are not acknowledged, so the client uses its defaults.
const (
	optBlksize   = "blksize"
	optTsize     = "tsize"
	minBlockSize = 512
	maxBlockSize = 65464
	// maxOptions bounds the option pairs read from one request.
	maxOptions = 16
)

// ErrNotRequest is returned by ParseRequest for a packet that is not a read or write request (a stray ACK,
// DATA or ERROR sent to the server port): the server ignores those.
var ErrNotRequest = errors.New("not a request")

// ErrMalformed is returned for a request that does not parse.
var ErrMalformed = errors.New("malformed request")

// Request is a parsed RRQ or WRQ.
type Request struct {
	// Write is set for a WRQ.
	Write bool
	// Filename is as sent (CleanName judges it).
	Filename string
	// Mode is lower case: "octet" or "netascii" (others are refused by ParseRequest).
	Mode string
	// Options holds the option pairs with lower-case names (RFC 2347: names are case-insensitive); the first
	// of a repeated name counts.
	Options map[string]string
}

// ParseRequest parses a datagram sent to the server port (RFC 1350 section 5, RFC 2347 options).
func ParseRequest(b []byte) (Request, error) {
	if len(b) < 2 {
		return Request{}, fmt.Errorf("%d-byte packet: %w", len(b), ErrMalformed)
	}

	var req Request

	switch op := binary.BigEndian.Uint16(b); op {
	case opRRQ:
	case opWRQ:
		req.Write = true
	case opDATA, opACK, opERROR, opOACK:
		return Request{}, fmt.Errorf("opcode %d: %w", op, ErrNotRequest)
	default:
		return Request{}, fmt.Errorf("opcode %d: %w", op, ErrMalformed)
	}

	// filename NUL mode NUL [name NUL value NUL]...: the element after the last NUL is what is left unterminated.
	fields := bytes.Split(b[2:], []byte{0})
	if len(fields) < 3 {
		return Request{}, fmt.Errorf("filename and mode not NUL-terminated: %w", ErrMalformed)
	}

	fields = fields[:len(fields)-1]

	req.Filename = string(fields[0])
	req.Mode = strings.ToLower(string(fields[1]))

	if req.Mode != "octet" && req.Mode != "netascii" {
		return Request{}, fmt.Errorf("mode %q: %w", req.Mode, ErrMalformed)
	}

	// Options end at an empty name (some ROMs pad their requests with NULs) or at a name without a value.
	opts := fields[2:]

	for i := 0; i+1 < len(opts) && i/2 < maxOptions && len(opts[i]) > 0; i += 2 {
		if req.Options == nil {
			req.Options = map[string]string{}
		}

		name := strings.ToLower(string(opts[i]))
		if _, seen := req.Options[name]; !seen {
			req.Options[name] = string(opts[i+1])
		}
	}

	return req, nil
}

// BlockSize returns the blksize to acknowledge for the request: the requested size clamped to limit, or 0
// when the request did not ask for one the edge grants (absent, below 512, not a number).
func (r Request) BlockSize(limit int) int {
	v, ok := r.Options[optBlksize]
	if !ok {
		return 0
	}

	n, err := strconv.Atoi(v)
	if err != nil || n < minBlockSize || n > maxBlockSize {
		return 0
	}

	return min(n, max(limit, minBlockSize))
}

// WantsSize reports whether the request asked for the transfer size (RFC 2349).
func (r Request) WantsSize() bool {
	_, ok := r.Options[optTsize]

	return ok
}

// appendOACK appends an OACK with the acknowledged options (RFC 2347); blksize 0 and size < 0 are left out.
func appendOACK(b []byte, blksize int, size int64) []byte {
	b = binary.BigEndian.AppendUint16(b, opOACK)

	if blksize > 0 {
		b = append(append(append(b, optBlksize...), 0), strconv.Itoa(blksize)...)
		b = append(b, 0)
	}

	if size >= 0 {
		b = append(append(append(b, optTsize...), 0), strconv.FormatInt(size, 10)...)
		b = append(b, 0)
	}

	return b
}

// appendData appends a DATA packet.
func appendData(b []byte, block uint16, data []byte) []byte {
	b = binary.BigEndian.AppendUint16(b, opDATA)
	b = binary.BigEndian.AppendUint16(b, block)

	return append(b, data...)
}

// appendError appends an ERROR packet. Messages stay short: an error answers a request that may carry a
// forged source, and it must not be larger than the request that earned it.
func appendError(b []byte, code uint16, msg string) []byte {
	b = binary.BigEndian.AppendUint16(b, opERROR)
	b = binary.BigEndian.AppendUint16(b, code)

	return append(append(b, msg...), 0)
}

// reply is what a client sent to a transfer's port.
type reply struct {
	ack     bool
	block   uint16
	errCode uint16
	errMsg  string
}

// parseReply parses an ACK or ERROR; ok is false for anything else (ignored).
func parseReply(b []byte) (reply, bool) {
	if len(b) < 4 {
		return reply{}, false
	}

	switch binary.BigEndian.Uint16(b) {
	case opACK:
		return reply{ack: true, block: binary.BigEndian.Uint16(b[2:])}, true
	case opERROR:
		msg, _, _ := bytes.Cut(b[4:], []byte{0})

		return reply{errCode: binary.BigEndian.Uint16(b[2:]), errMsg: string(msg)}, true
	default:
		return reply{}, false
	}
}
