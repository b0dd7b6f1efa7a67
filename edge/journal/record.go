package journal

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
)

// On disk, the journal is a sequence of records:
//
//	length   uint32 big-endian   length of body
//	checksum uint32 big-endian   CRC-32C of body
//	body     type byte, then an Event protobuf (typeEvent) or a big-endian uint64 sequence (typeAck)
//
// A crash can leave a torn last record; decoding stops at the first record that is short or fails its
// checksum, and the file is truncated there.

const (
	headerLen = 8
	// maxBodyLen bounds one record; an event is a few hundred bytes.
	maxBodyLen = 64 << 10

	typeEvent byte = 1
	typeAck   byte = 2
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// ErrCorrupt is returned for bytes that are not a whole, valid record.
var ErrCorrupt = errors.New("corrupt journal record")

// Record is one decoded record.
type Record struct {
	Type byte
	// Body is the payload after the type byte.
	Body []byte
}

// AppendRecord appends the encoding of one record to dst.
func AppendRecord(dst []byte, typ byte, payload []byte) []byte {
	var hdr [headerLen]byte

	body := make([]byte, 0, 1+len(payload))
	body = append(body, typ)
	body = append(body, payload...)

	binary.BigEndian.PutUint32(hdr[0:4], uint32(len(body))) // bounded by maxBodyLen at callers
	binary.BigEndian.PutUint32(hdr[4:8], crc32.Checksum(body, castagnoli))

	return append(append(dst, hdr[:]...), body...)
}

// DecodeRecord decodes the record at the start of b and returns it with its encoded length.
func DecodeRecord(b []byte) (Record, int, error) {
	if len(b) < headerLen {
		return Record{}, 0, fmt.Errorf("header of %d bytes: %w", len(b), ErrCorrupt)
	}

	n := binary.BigEndian.Uint32(b[0:4])
	if n == 0 || n > maxBodyLen {
		return Record{}, 0, fmt.Errorf("body length %d: %w", n, ErrCorrupt)
	}

	if uint64(len(b)-headerLen) < uint64(n) {
		return Record{}, 0, fmt.Errorf("body of %d bytes, want %d: %w", len(b)-headerLen, n, ErrCorrupt)
	}

	body := b[headerLen : headerLen+int(n)]
	if crc32.Checksum(body, castagnoli) != binary.BigEndian.Uint32(b[4:8]) {
		return Record{}, 0, fmt.Errorf("checksum mismatch: %w", ErrCorrupt)
	}

	switch body[0] {
	case typeEvent:
	case typeAck:
		if len(body) != 9 {
			return Record{}, 0, fmt.Errorf("ack of %d bytes: %w", len(body)-1, ErrCorrupt)
		}
	default:
		return Record{}, 0, fmt.Errorf("record type %d: %w", body[0], ErrCorrupt)
	}

	return Record{Type: body[0], Body: body[1:]}, headerLen + int(n), nil
}

// DecodeAll decodes records from the start of b until the end or the first bad record, and returns
// them with the length of the valid prefix.
func DecodeAll(b []byte) ([]Record, int) {
	var (
		out []Record
		off int
	)

	for off < len(b) {
		r, n, err := DecodeRecord(b[off:])
		if err != nil {
			break
		}

		out = append(out, r)
		off += n
	}

	return out, off
}

func ackPayload(seq uint64) []byte {
	return binary.BigEndian.AppendUint64(nil, seq)
}

func ackSeq(body []byte) uint64 {
	return binary.BigEndian.Uint64(body)
}
