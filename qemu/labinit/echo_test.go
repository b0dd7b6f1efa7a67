package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestEchoEach(t *testing.T) {
	t.Parallel()

	var out bytes.Buffer

	echoEach(strings.NewReader("hello\r\n\nsecond line\n"+strings.Repeat("x", 1000)+"\nafter\n"), &out)

	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	require.Equal(t, []string{"OUTPOST-ECHO hello", "OUTPOST-ECHO second line", "OUTPOST-ECHO " + strings.Repeat("x", 256), "OUTPOST-ECHO after"}, lines)
}
