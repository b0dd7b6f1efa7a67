package admincli

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"

	consolepb "github.com/outpost-metal/outpost/shared/api/console"
)

// DetachKey ends a console session typed at it (Ctrl-], as telnet's escape).
const DetachKey = 0x1d

// Console attaches to machine's serial console through its site's edge: out gets the console's output, notes
// the controller's and edge's notices (one a line). With write, in is typed at the console until it ends or
// DetachKey is read; read-only sessions never read in. It returns when ctx ends or the session does.
func (c *Client) Console(ctx context.Context, machine, operator string, write bool, in io.Reader, out, notes io.Writer) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	stream, err := consolepb.NewConsoleClient(c.conn).Attach(ctx)
	if err != nil {
		return fmt.Errorf("attach console of %s: %w", machine, err)
	}

	if err := stream.Send(&consolepb.Input{Kind: &consolepb.Input_Open{Open: &consolepb.Open{Machine: machine, Write: write, Operator: operator}}}); err != nil {
		return fmt.Errorf("attach console of %s: %w", machine, err)
	}

	first, err := stream.Recv()
	if err != nil {
		return fmt.Errorf("attach console of %s: %w", machine, err)
	}

	mode := "read-only"
	if first.GetAttached().GetWrite() {
		mode = "read-write, Ctrl-] detaches"
	}

	fmt.Fprintf(notes, "[console of %s via %s, %s]\r\n", machine, first.GetAttached().GetVia(), mode) //nolint:errcheck

	if write {
		go typeInto(stream, in)
	}

	for {
		f, err := stream.Recv()
		if errors.Is(err, io.EOF) || ctx.Err() != nil {
			fmt.Fprint(notes, "[console detached]\r\n") //nolint:errcheck

			return nil
		}

		if err != nil {
			return fmt.Errorf("console of %s: %w", machine, err)
		}

		if n := f.GetNotice(); n != "" {
			fmt.Fprintf(notes, "[%s]\r\n", n) //nolint:errcheck
		}

		if _, err := out.Write(f.GetData()); err != nil {
			return fmt.Errorf("console of %s: write output: %w", machine, err)
		}
	}
}

// typeInto sends what is read from in as typed input, in frames of at most 1 KiB, until in ends or DetachKey.
func typeInto(stream consolepb.Console_AttachClient, in io.Reader) {
	defer stream.CloseSend() //nolint:errcheck

	buf := make([]byte, 1<<10)

	for {
		n, err := in.Read(buf)

		data := buf[:n]
		detach := false

		if i := bytes.IndexByte(data, DetachKey); i >= 0 {
			data, detach = data[:i], true
		}

		if len(data) > 0 {
			if err := stream.Send(&consolepb.Input{Kind: &consolepb.Input_Data{Data: bytes.Clone(data)}}); err != nil {
				return
			}
		}

		if err != nil || detach {
			return
		}
	}
}
