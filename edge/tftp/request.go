package tftp

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// What the admission filter reads of the datagrams on the server port: the opcode of every datagram, the
// block of an acknowledgement, and the whole of a request (to decide it and to normalise it for pin/tftp).
// The protocol itself (options acknowledgement, blocks, retransmission, netascii) is pin/tftp's.

// Opcodes (RFC 1350 section 5; OACK from RFC 2347).
const (
	opRRQ   uint16 = 1
	opWRQ   uint16 = 2
	opDATA  uint16 = 3
	opACK   uint16 = 4
	opERROR uint16 = 5
	opOACK  uint16 = 6
)

// Error codes (RFC 1350 appendix).
const (
	errNotDefined      uint16 = 0
	errFileNotFound    uint16 = 1
	errAccessViolation uint16 = 2
	errIllegalOp       uint16 = 4
)

// Options the edge acknowledges and their bounds: blksize from RFC 2348 (512 and more only, as the edge always
// granted), tsize from RFC 2349. Others (timeout, windowsize) are left out, so the client uses its defaults.
const (
	optBlksize   = "blksize"
	optTsize     = "tsize"
	minBlockSize = 512
	maxBlockSize = 65464
	// maxOptions bounds the option pairs read from one request.
	maxOptions = 16
)

// errMalformed is what a request that does not parse is refused with.
var errMalformed = errors.New("malformed request")

// request is a parsed RRQ or WRQ.
type request struct {
	write bool
	name  string
	// mode is lower case: "octet" or "netascii" (others do not parse).
	mode string
	// blksize is the blksize asked for, 0 when none (absent, below 512, above 65464, not a number).
	blksize int
	// tsize is set when the client asked for the transfer size.
	tsize bool
}

// parseRequest parses a read or write request (RFC 1350 section 5, RFC 2347 options). Option names are
// case-insensitive (RFC 2347) and the first of a repeated name counts; options end at an empty name (some
// ROMs pad their requests with NULs) or at a name without a value.
func parseRequest(b []byte) (request, error) {
	if len(b) < 2 {
		return request{}, fmt.Errorf("%d-byte packet: %w", len(b), errMalformed)
	}

	var req request

	switch op := binary.BigEndian.Uint16(b); op {
	case opRRQ:
	case opWRQ:
		req.write = true
	default:
		return request{}, fmt.Errorf("opcode %d: %w", op, errMalformed)
	}

	// filename NUL mode NUL [name NUL value NUL]...: the element after the last NUL is what is left unterminated.
	fields := bytes.Split(b[2:], []byte{0})
	if len(fields) < 3 {
		return request{}, fmt.Errorf("filename and mode not NUL-terminated: %w", errMalformed)
	}

	fields = fields[:len(fields)-1]
	req.name = string(fields[0])
	req.mode = strings.ToLower(string(fields[1]))

	if req.mode != "octet" && req.mode != "netascii" {
		return request{}, fmt.Errorf("mode %q: %w", req.mode, errMalformed)
	}

	seen := map[string]bool{}
	opts := fields[2:]

	for i := 0; i+1 < len(opts) && i/2 < maxOptions && len(opts[i]) > 0; i += 2 {
		name := strings.ToLower(string(opts[i]))
		if seen[name] {
			continue
		}

		seen[name] = true

		switch name {
		case optBlksize:
			if n, err := strconv.Atoi(string(opts[i+1])); err == nil && n >= minBlockSize && n <= maxBlockSize {
				req.blksize = n
			}
		case optTsize:
			req.tsize = true
		}
	}

	return req, nil
}

// appendNormalized appends the request as pin/tftp is given it: lower-case mode and option names (the library
// compares them case-sensitively), blksize clamped to limit (the library is told nothing of the interface a
// request came in on), only the options the edge acknowledges.
func (r request) appendNormalized(b []byte, limit int) []byte {
	op := opRRQ
	if r.write {
		op = opWRQ
	}

	b = binary.BigEndian.AppendUint16(b, op)
	b = append(append(b, r.name...), 0)
	b = append(append(b, r.mode...), 0)

	if r.blksize > 0 {
		b = append(append(b, optBlksize...), 0)
		b = append(strconv.AppendInt(b, int64(min(r.blksize, max(limit, minBlockSize))), 10), 0)
	}

	if r.tsize {
		b = append(append(b, optTsize...), 0, '0', 0)
	}

	return b
}

// appendError appends an ERROR packet (RFC 1350). Messages stay short: an error answers a request that may
// carry a forged source, and it must not be larger than the request that earned it.
func appendError(b []byte, code uint16, msg string) []byte {
	b = binary.BigEndian.AppendUint16(b, opERROR)
	b = binary.BigEndian.AppendUint16(b, code)

	return append(append(b, msg...), 0)
}
