package vbmc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"time"
)

// QMP is a MediaBackend for a QEMU machine: it changes the medium of the machine's CD-ROM drive through QEMU's
// machine protocol (QMP, docs/interop/qmp-spec in QEMU) on a unix socket (-qmp unix:PATH,server=on,wait=off),
// with blockdev-change-medium and eject. A socket nobody listens on is a machine that is off (ErrNotRunning).
// QEMU opens an http(s) image with its curl block driver, which reads it by byte ranges.
type QMP struct {
	// Socket is the QMP socket's path.
	Socket string
	// Device is the CD-ROM device's qdev id (-device ide-cd,id=DEVICE,...).
	Device string
	// Timeout bounds one exchange (default 30 s: QEMU opens an http image before it answers).
	Timeout time.Duration
}

// maxQMPMessage bounds one message read from QEMU.
const maxQMPMessage = 1 << 20

// QMPError is an error QEMU answered a command with.
type QMPError struct {
	Command string
	Class   string
	Desc    string
}

func (e *QMPError) Error() string {
	return fmt.Sprintf("qmp %s: %s: %s", e.Command, e.Class, e.Desc)
}

// Insert implements MediaBackend.
func (q QMP) Insert(ctx context.Context, image string) error {
	return q.Execute(ctx, "blockdev-change-medium", map[string]any{
		"id": q.Device, "filename": image, "format": "raw", "read-only-mode": "read-only",
	}, nil)
}

// Eject implements MediaBackend.
func (q QMP) Eject(ctx context.Context) error {
	return q.Execute(ctx, "eject", map[string]any{"id": q.Device, "force": true}, nil)
}

// Execute runs one QMP command and decodes its return value into ret (nil: ignore it).
func (q QMP) Execute(ctx context.Context, command string, args map[string]any, ret any) error {
	timeout := q.Timeout
	if timeout <= 0 {
		timeout = 30 * time.Second
	}

	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()

	var d net.Dialer

	conn, err := d.DialContext(ctx, "unix", q.Socket)
	if errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ECONNREFUSED) {
		return ErrNotRunning
	}

	if err != nil {
		return fmt.Errorf("qmp %s: %w", command, err)
	}
	defer conn.Close()

	if dl, ok := ctx.Deadline(); ok {
		conn.SetDeadline(dl) //nolint:errcheck
	}

	dec := json.NewDecoder(io.LimitReader(conn, maxQMPMessage))

	var greeting struct{ QMP json.RawMessage }
	if err := dec.Decode(&greeting); err != nil || greeting.QMP == nil {
		return fmt.Errorf("qmp %s: no greeting from qemu: %v", command, err) //nolint:errorlint // the error is only text
	}

	if err := exchange(conn, dec, "qmp_capabilities", nil, nil); err != nil {
		return err
	}

	return exchange(conn, dec, command, args, ret)
}

// exchange sends one command and reads up to its answer, skipping asynchronous events.
func exchange(conn net.Conn, dec *json.Decoder, command string, args map[string]any, ret any) error {
	req := map[string]any{"execute": command}
	if args != nil {
		req["arguments"] = args
	}

	if err := json.NewEncoder(conn).Encode(req); err != nil {
		return fmt.Errorf("qmp %s: %w", command, err)
	}

	for {
		var msg struct {
			Return json.RawMessage `json:"return"`
			Error  *struct {
				Class string `json:"class"`
				Desc  string `json:"desc"`
			} `json:"error"`
			Event string `json:"event"`
		}

		if err := dec.Decode(&msg); err != nil {
			return fmt.Errorf("qmp %s: read answer: %w", command, err)
		}

		switch {
		case msg.Error != nil:
			return &QMPError{Command: command, Class: msg.Error.Class, Desc: msg.Error.Desc}
		case msg.Return != nil:
			if ret == nil {
				return nil
			}

			if err := json.Unmarshal(msg.Return, ret); err != nil {
				return fmt.Errorf("qmp %s: decode answer: %w", command, err)
			}

			return nil
		}
	}
}
