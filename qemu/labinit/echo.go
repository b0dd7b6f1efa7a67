package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
)

// echoLine bounds a line echoEach answers; the rest of a longer line is dropped.
const echoLine = 256

// echoConsole answers each line typed at the serial console (ttyS0) with "OUTPOST-ECHO <line>": the effect of
// typing that the lab's console test looks for through the BMC's serial-over-LAN.
func echoConsole() {
	var in io.Reader = os.Stdin
	if tty, err := os.Open("/dev/ttyS0"); err == nil {
		in = tty
	}

	echoEach(in, os.Stdout)
}

// echoEach writes "OUTPOST-ECHO <line>" to out for each line of in, at most echoLine bytes of it.
func echoEach(in io.Reader, out io.Writer) {
	r := bufio.NewReaderSize(in, echoLine)

	for {
		line, err := r.ReadSlice('\n')
		full := string(line)

		for errors.Is(err, bufio.ErrBufferFull) { // over echoLine: drop the rest of the line
			_, err = r.ReadSlice('\n')
		}

		if s := strings.TrimSpace(full); s != "" {
			fmt.Fprintln(out, "OUTPOST-ECHO", s) //nolint:errcheck
		}

		if err != nil {
			return
		}
	}
}
