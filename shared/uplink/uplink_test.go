package uplink_test

import (
	"bytes"
	"crypto/sha256"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	uplinkpb "github.com/outpost-metal/outpost/shared/api/uplink"
	"github.com/outpost-metal/outpost/shared/uplink"
)

func TestJoinTokenRoundTrip(t *testing.T) {
	t.Parallel()

	tok := uplink.JoinToken{SiteID: "branch-7", Secret: bytes.Repeat([]byte{0xab}, uplink.SecretLen), CAFingerprint: sha256.Sum256([]byte("ca"))}

	parsed, err := uplink.ParseJoinToken("  " + tok.String() + "\n")
	require.NoError(t, err)
	require.Equal(t, tok, parsed)
	require.Equal(t, sha256.Sum256(tok.Secret), [32]byte(parsed.SecretHash()))
}

func TestParseJoinTokenRejects(t *testing.T) {
	t.Parallel()

	good := uplink.JoinToken{SiteID: "s", Secret: make([]byte, uplink.SecretLen)}.String()
	parts := strings.Split(good, ".")

	for _, tc := range []struct{ name, token, want string }{
		{"empty", "", "expected outpost1."},
		{"wrong prefix", "outpost2." + strings.Join(parts[1:], "."), "expected outpost1."},
		{"bad site", strings.Join([]string{parts[0], "Bad_Site", parts[2], parts[3]}, "."), "not a lower-case DNS label"},
		{"short secret", strings.Join([]string{parts[0], "s", "AAAA", parts[3]}, "."), "secret is not 32"},
		{"bad fingerprint", strings.Join([]string{parts[0], "s", parts[2], "!!"}, "."), "fingerprint"},
		{"extra part", good + ".x", "expected outpost1."},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()

			_, err := uplink.ParseJoinToken(tc.token)
			require.ErrorIs(t, err, uplink.ErrMalformedToken)
			require.ErrorContains(t, err, tc.want)
			require.NotContains(t, err.Error(), parts[2], "an error must never echo the secret")
		})
	}
}

func TestFrameRoundTripAndLimits(t *testing.T) {
	t.Parallel()

	var buf bytes.Buffer

	hello := &uplinkpb.Hello{SiteId: "a", EdgeVersion: "v1", Purpose: uplinkpb.Hello_PURPOSE_SESSION}
	require.NoError(t, uplink.WriteFrame(&buf, 3, hello))

	frame, err := uplink.ReadFrame(&buf)
	require.NoError(t, err)
	require.EqualValues(t, 3, frame.ProtocolVersion)

	got, err := uplink.DecodeHello(frame.Payload)
	require.NoError(t, err)
	require.Equal(t, "a", got.GetSiteId())

	_, err = uplink.ReadFrame(strings.NewReader("HTTP/1.1 200 OK\r\n"))
	require.ErrorIs(t, err, uplink.ErrBadMagic)

	_, err = uplink.ReadFrame(strings.NewReader("OPUL\x00\x01\xff\xff"))
	require.ErrorContains(t, err, "exceeds the limit")

	_, err = uplink.ReadFrame(strings.NewReader("OPUL\x00\x01\x00\x10short"))
	require.ErrorContains(t, err, "read hello payload")

	_, err = uplink.DecodeHello(nil)
	require.ErrorContains(t, err, "purpose")
}

// FuzzHelloFrame feeds arbitrary bytes to the frame reader and hello decoder: they must return
// a hello or an error, never panic, and never accept a frame larger than the limit.
func FuzzHelloFrame(f *testing.F) {
	var seed bytes.Buffer

	uplink.WriteFrame(&seed, 1, &uplinkpb.Hello{SiteId: "site-1", EdgeVersion: "v0.1.0", Purpose: uplinkpb.Hello_PURPOSE_ENROLL}) //nolint:errcheck
	f.Add(seed.Bytes())
	f.Add([]byte("OPUL\x00\x01\x00\x00"))
	f.Add([]byte("OPUL\xff\xff\x10\x00"))
	f.Add([]byte("\x16\x03\x01\x00"))

	f.Fuzz(func(t *testing.T, data []byte) {
		frame, err := uplink.ReadFrame(bytes.NewReader(data))
		if err != nil {
			return
		}

		if len(frame.Payload) > uplink.MaxFramePayload {
			t.Fatalf("accepted a payload of %d bytes", len(frame.Payload))
		}

		hello, err := uplink.DecodeHello(frame.Payload)
		if err != nil {
			return
		}

		if uplink.ValidateSiteID(hello.GetSiteId()) != nil {
			t.Fatalf("accepted hello with invalid site ID %q", hello.GetSiteId())
		}

		uplink.DecodeHelloReply(frame.Payload) //nolint:errcheck // must not panic either
	})
}

// FuzzJoinToken parses arbitrary strings as join tokens: a token that parses must print back to
// an equivalent token, and no error may contain the input's secret part.
func FuzzJoinToken(f *testing.F) {
	f.Add(uplink.JoinToken{SiteID: "x", Secret: make([]byte, uplink.SecretLen)}.String())
	f.Add("outpost1....")
	f.Add("outpost1.a.b.c")

	f.Fuzz(func(t *testing.T, s string) {
		tok, err := uplink.ParseJoinToken(s)
		if err != nil {
			return
		}

		again, err := uplink.ParseJoinToken(tok.String())
		if err != nil {
			t.Fatalf("re-parse of %q: %v", tok.String(), err)
		}

		if again.SiteID != tok.SiteID || !bytes.Equal(again.Secret, tok.Secret) || again.CAFingerprint != tok.CAFingerprint {
			t.Fatalf("round trip changed the token")
		}
	})
}

func TestHelloJoinToken(t *testing.T) {
	t.Parallel()

	for _, tc := range []struct {
		name  string
		hello *uplinkpb.Hello
		want  string
	}{
		{"enrol with token", &uplinkpb.Hello{SiteId: "a", Purpose: uplinkpb.Hello_PURPOSE_ENROLL, JoinToken: "outpost1.a.b.c"}, ""},
		{"session with token", &uplinkpb.Hello{SiteId: "a", Purpose: uplinkpb.Hello_PURPOSE_SESSION, JoinToken: "outpost1.a.b.c"}, "only an enrolment hello carries a join token"},
		{"token too long", &uplinkpb.Hello{SiteId: "a", Purpose: uplinkpb.Hello_PURPOSE_ENROLL, JoinToken: strings.Repeat("x", uplink.MaxJoinTokenLen+1)}, "join token of 257 bytes is too long"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()

			var buf bytes.Buffer

			require.NoError(t, uplink.WriteFrame(&buf, 1, tc.hello))

			frame, err := uplink.ReadFrame(&buf)
			require.NoError(t, err)

			got, err := uplink.DecodeHello(frame.Payload)
			if tc.want != "" {
				require.ErrorContains(t, err, tc.want)

				return
			}

			require.NoError(t, err)
			require.Equal(t, tc.hello.GetJoinToken(), got.GetJoinToken())
		})
	}
}
