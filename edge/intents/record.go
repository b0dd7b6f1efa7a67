package intents

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"

	"google.golang.org/protobuf/proto"

	intentspb "github.com/outpost-metal/outpost/shared/api/intents"
)

// On disk, the store is a sequence of records, each an intent's state at one moment (the last one of an
// intent wins):
//
//	length   uint32 big-endian   length of body
//	checksum uint32 big-endian   CRC-32C of body
//	body     an IntentOutcome protobuf
//
// A crash can leave a torn last record; decoding stops at the first record that is short, fails its checksum
// or does not hold a valid intent, and the store is rewritten without it.

const (
	headerLen = 8
	// maxBodyLen bounds one record: a kept response, an ID, a machine ID, a method name and a status message.
	maxBodyLen = maxResponse + 8<<10
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// ErrCorrupt is returned for bytes that are not a whole, valid record.
var ErrCorrupt = errors.New("corrupt intent record")

// AppendRecord appends the encoding of o to dst.
func AppendRecord(dst []byte, o *intentspb.IntentOutcome) ([]byte, error) {
	body, err := proto.Marshal(o)
	if err != nil {
		return dst, fmt.Errorf("encode intent %s: %w", o.GetIntentId(), err)
	}

	if len(body) == 0 || len(body) > maxBodyLen {
		return dst, fmt.Errorf("intent %s: record of %d bytes: %w", o.GetIntentId(), len(body), ErrCorrupt)
	}

	var hdr [headerLen]byte

	binary.BigEndian.PutUint32(hdr[0:4], uint32(len(body)))
	binary.BigEndian.PutUint32(hdr[4:8], crc32.Checksum(body, castagnoli))

	return append(append(dst, hdr[:]...), body...), nil
}

// DecodeRecord decodes the record at the start of b and returns it with its encoded length.
func DecodeRecord(b []byte) (*intentspb.IntentOutcome, int, error) {
	if len(b) < headerLen {
		return nil, 0, fmt.Errorf("header of %d bytes: %w", len(b), ErrCorrupt)
	}

	n := binary.BigEndian.Uint32(b[0:4])
	if n == 0 || n > maxBodyLen {
		return nil, 0, fmt.Errorf("body length %d: %w", n, ErrCorrupt)
	}

	if uint64(len(b)-headerLen) < uint64(n) {
		return nil, 0, fmt.Errorf("body of %d bytes, want %d: %w", len(b)-headerLen, n, ErrCorrupt)
	}

	body := b[headerLen : headerLen+int(n)]
	if crc32.Checksum(body, castagnoli) != binary.BigEndian.Uint32(b[4:8]) {
		return nil, 0, fmt.Errorf("checksum mismatch: %w", ErrCorrupt)
	}

	o := &intentspb.IntentOutcome{}
	if err := proto.Unmarshal(body, o); err != nil {
		return nil, 0, fmt.Errorf("%w: %w", ErrCorrupt, err)
	}

	if err := intentspb.CheckID(o.GetIntentId()); err != nil {
		return nil, 0, fmt.Errorf("%w: %w", ErrCorrupt, err)
	}

	switch o.GetState() {
	case intentspb.State_STATE_RUNNING, intentspb.State_STATE_DONE, intentspb.State_STATE_FAILED, intentspb.State_STATE_INTERRUPTED:
	case intentspb.State_STATE_UNKNOWN:
		return nil, 0, fmt.Errorf("intent %s in state %s: %w", o.GetIntentId(), o.GetState(), ErrCorrupt)
	default:
		return nil, 0, fmt.Errorf("intent %s in state %d: %w", o.GetIntentId(), o.GetState(), ErrCorrupt)
	}

	return o, headerLen + int(n), nil
}

// DecodeAll decodes records from the start of b until the end or the first bad record, and returns them with
// the length of the valid prefix.
func DecodeAll(b []byte) ([]*intentspb.IntentOutcome, int) {
	var (
		out []*intentspb.IntentOutcome
		off int
	)

	for off < len(b) {
		o, n, err := DecodeRecord(b[off:])
		if err != nil {
			break
		}

		out = append(out, o)
		off += n
	}

	return out, off
}
