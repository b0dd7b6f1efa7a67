package scrub_test

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/outpost-metal/outpost/edge/bmc/internal/scrub"
)

func TestText(t *testing.T) {
	t.Parallel()

	for _, tc := range []struct {
		name    string
		text    string
		secrets []string
		want    string
	}{
		{name: "one-character password inside words", text: "no matching IPMI response (expected rqSeq 0x01)", secrets: []string{"x"}, want: "no matching IPMI response (expected rqSeq 0x01)"},
		{name: "one-character password as a word", text: "password x is wrong", secrets: []string{"x"}, want: "password [redacted] is wrong"},
		{name: "one-character password at the ends", text: "x", secrets: []string{"x"}, want: "[redacted]"},
		{name: "hex digits are words", text: "cc: 0xcc", secrets: []string{"x"}, want: "cc: 0xcc"},
		{name: "common word inside a longer word", text: "powered off; overpower", secrets: []string{"power"}, want: "powered off; overpower"},
		{name: "common word as a word", text: "login failed for power", secrets: []string{"power"}, want: "login failed for [redacted]"},
		{name: "quoted in a json body", text: `{"UserName":"admin","Password":"power"}`, secrets: []string{"power"}, want: `{"UserName":"admin","Password":"[redacted]"}`},
		{name: "json-escaped form", text: `{"Password":"a\"b"}`, secrets: []string{`a"b`}, want: `{"Password":"[redacted]"}`},
		{name: "every occurrence", text: "s3cret, s3cret; s3crets", secrets: []string{"s3cret"}, want: "[redacted], [redacted]; s3crets"},
		{name: "punctuation in the password", text: "bad password hunter2-hunter2.", secrets: []string{"hunter2-hunter2"}, want: "bad password [redacted]."},
		{name: "letters of other scripts are word characters", text: "éx xé x", secrets: []string{"x"}, want: "éx xé [redacted]"},
		{name: "user name inside the password", text: "admin: admin123", secrets: []string{"admin", "admin123"}, want: "[redacted]: [redacted]"},
		{name: "underscore joins words", text: "x_y x", secrets: []string{"x"}, want: "x_y [redacted]"},
		{name: "empty secret", text: "anything", secrets: []string{""}, want: "anything"},
		{name: "overlapping candidates", text: "aaa aa", secrets: []string{"aa"}, want: "aaa [redacted]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()

			require.Equal(t, tc.want, scrub.Text(tc.text, tc.secrets...))
		})
	}
}

func TestErrorKeepsOnlyItsKind(t *testing.T) {
	t.Parallel()

	kind := errors.New("no answer")
	orig := errors.New("dial: password x refused")
	err := scrub.NewError(orig, kind, "x")

	require.Equal(t, "no answer: dial: password [redacted] refused", err.Error())
	require.ErrorIs(t, err, kind)
	require.NotErrorIs(t, err, orig, "the original (with the secret) is not reachable")
}
