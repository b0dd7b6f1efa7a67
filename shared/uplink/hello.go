package uplink

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"google.golang.org/protobuf/proto"

	uplinkpb "github.com/outpost-metal/outpost/shared/api/uplink"
)

// Magic opens every hello frame, so that a stray client (a port scanner, a browser, an old edge)
// is recognised at once instead of being parsed as a message.
const Magic = "OPUL"

// headerLen is the fixed frame header: magic (4), protocol version (2), payload length (2), big endian.
const headerLen = len(Magic) + 2 + 2

// MaxFramePayload bounds the protobuf payload of a hello frame.
const MaxFramePayload = 4096

// MaxJoinTokenLen bounds the text form of a join token in a hello; a real one is at most 160 bytes.
const MaxJoinTokenLen = 256

// ErrBadMagic means the peer does not speak the uplink protocol at all.
var ErrBadMagic = errors.New("not an outpost uplink hello (bad magic)")

// Frame is a decoded hello frame: the sender's protocol version and its protobuf payload.
type Frame struct {
	ProtocolVersion uint16
	Payload         []byte
}

// ParseFrameHeader checks a frame header and returns the sender's protocol version and the payload length.
func ParseFrameHeader(hdr []byte) (version uint16, length int, err error) {
	if len(hdr) < headerLen {
		return 0, 0, fmt.Errorf("hello header: %d bytes, need %d", len(hdr), headerLen)
	}

	if string(hdr[:len(Magic)]) != Magic {
		return 0, 0, ErrBadMagic
	}

	version = binary.BigEndian.Uint16(hdr[4:6])
	length = int(binary.BigEndian.Uint16(hdr[6:8]))

	if length > MaxFramePayload {
		return 0, 0, fmt.Errorf("hello payload of %d bytes exceeds the limit of %d", length, MaxFramePayload)
	}

	return version, length, nil
}

// ReadFrame reads one frame. The caller sets a read deadline on the connection.
func ReadFrame(r io.Reader) (Frame, error) {
	var hdr [headerLen]byte

	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return Frame{}, fmt.Errorf("read hello header: %w", err)
	}

	version, length, err := ParseFrameHeader(hdr[:])
	if err != nil {
		return Frame{}, err
	}

	payload := make([]byte, length)
	if _, err := io.ReadFull(r, payload); err != nil {
		return Frame{}, fmt.Errorf("read hello payload: %w", err)
	}

	return Frame{ProtocolVersion: version, Payload: payload}, nil
}

// WriteFrame writes msg as one frame stamped with the given protocol version.
func WriteFrame(w io.Writer, version uint16, msg proto.Message) error {
	payload, err := proto.Marshal(msg)
	if err != nil {
		return fmt.Errorf("marshal hello: %w", err)
	}

	if len(payload) > MaxFramePayload {
		return fmt.Errorf("hello payload of %d bytes exceeds the limit of %d", len(payload), MaxFramePayload)
	}

	buf := make([]byte, headerLen, headerLen+len(payload))
	copy(buf, Magic)
	binary.BigEndian.PutUint16(buf[4:6], version)
	binary.BigEndian.PutUint16(buf[6:8], uint16(len(payload)))
	buf = append(buf, payload...)

	if _, err := w.Write(buf); err != nil {
		return fmt.Errorf("write hello: %w", err)
	}

	return nil
}

// DecodeHello parses the payload of an edge's hello frame and checks its fields.
func DecodeHello(payload []byte) (*uplinkpb.Hello, error) {
	var hello uplinkpb.Hello

	if err := proto.Unmarshal(payload, &hello); err != nil {
		return nil, fmt.Errorf("decode hello: %w", err)
	}

	switch hello.GetPurpose() {
	case uplinkpb.Hello_PURPOSE_SESSION, uplinkpb.Hello_PURPOSE_ENROLL:
	default:
		return nil, fmt.Errorf("hello purpose %v is not known", hello.GetPurpose())
	}

	if err := ValidateSiteID(hello.GetSiteId()); err != nil {
		return nil, fmt.Errorf("hello: %w", err)
	}

	if len(hello.GetEdgeVersion()) > 128 {
		return nil, fmt.Errorf("hello: edge version of %d bytes is too long", len(hello.GetEdgeVersion()))
	}

	if len(hello.GetJoinToken()) > MaxJoinTokenLen {
		return nil, fmt.Errorf("hello: join token of %d bytes is too long", len(hello.GetJoinToken()))
	}

	if hello.GetJoinToken() != "" && hello.GetPurpose() != uplinkpb.Hello_PURPOSE_ENROLL {
		return nil, errors.New("hello: only an enrolment hello carries a join token")
	}

	return &hello, nil
}

// DecodeHelloReply parses the payload of the controller's reply frame.
func DecodeHelloReply(payload []byte) (*uplinkpb.HelloReply, error) {
	var reply uplinkpb.HelloReply

	if err := proto.Unmarshal(payload, &reply); err != nil {
		return nil, fmt.Errorf("decode hello reply: %w", err)
	}

	return &reply, nil
}
