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

// FuzzEchoEach: whatever is typed, each answer is one bounded line.
func FuzzEchoEach(f *testing.F) {
	f.Add([]byte("hello\r\n"))
	f.Add(bytes.Repeat([]byte("x"), 3000))

	f.Fuzz(func(t *testing.T, in []byte) {
		var out bytes.Buffer

		echoEach(bytes.NewReader(in), &out)

		for _, line := range strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n") {
			if line == "" {
				continue
			}

			if !strings.HasPrefix(line, "OUTPOST-ECHO ") || len(line) > len("OUTPOST-ECHO ")+echoLine {
				t.Fatalf("answer %q", line)
			}
		}
	})
}
