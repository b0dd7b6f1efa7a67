package main

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// bmcChannel is the machine's in-band path to its virtual BMC: a serial port whose other end the lab serves.
// Requests and answers are single lines ("GET-LAN" -> "OK <address> <port>", "USER-EXISTS <name>" -> "OK yes",
// "SET-USER <name> <password>" -> "OK", "INSTALLED" -> "OK"); errors are answered "ERR <text>".
type bmcChannel struct {
	mu sync.Mutex
	f  *os.File
	r  *bufio.Reader
}

func openBMCChannel(path string) (*bmcChannel, error) {
	f, err := os.OpenFile(path, os.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		return nil, fmt.Errorf("open bmc channel %s: %w", path, err)
	}

	// Raw mode: no echo, no line editing, no newline translation.
	t, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	if err != nil {
		f.Close() //nolint:errcheck

		return nil, fmt.Errorf("get termios of %s: %w", path, err)
	}

	t.Iflag &^= unix.IGNBRK | unix.BRKINT | unix.PARMRK | unix.ISTRIP | unix.INLCR | unix.IGNCR | unix.ICRNL | unix.IXON
	t.Oflag &^= unix.OPOST
	t.Lflag &^= unix.ECHO | unix.ECHONL | unix.ICANON | unix.ISIG | unix.IEXTEN
	t.Cflag &^= unix.CSIZE | unix.PARENB
	t.Cflag |= unix.CS8
	t.Cc[unix.VMIN], t.Cc[unix.VTIME] = 1, 0

	if err := unix.IoctlSetTermios(int(f.Fd()), unix.TCSETS, t); err != nil {
		f.Close() //nolint:errcheck

		return nil, fmt.Errorf("set termios of %s: %w", path, err)
	}

	return &bmcChannel{f: f, r: bufio.NewReader(f)}, nil
}

func (c *bmcChannel) call(req string) (string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()

	if _, err := fmt.Fprintf(c.f, "%s\n", req); err != nil {
		return "", fmt.Errorf("write bmc channel: %w", err)
	}

	for {
		line, err := c.r.ReadString('\n')
		if err != nil {
			return "", fmt.Errorf("read bmc channel: %w", err)
		}

		line = strings.TrimSpace(line)

		switch {
		case line == "OK":
			return "", nil
		case strings.HasPrefix(line, "OK "):
			return strings.TrimPrefix(line, "OK "), nil
		case strings.HasPrefix(line, "ERR"):
			return "", errors.New("bmc: " + strings.TrimSpace(strings.TrimPrefix(line, "ERR")))
		}
		// Anything else is noise from before the lab connected; skip it.
	}
}

// LANAddress implements testagent.BMC.
func (c *bmcChannel) LANAddress() (string, uint32, error) {
	out, err := c.call("GET-LAN")
	if err != nil {
		return "", 0, err
	}

	addr, portStr, ok := strings.Cut(out, " ")
	if !ok {
		return "", 0, fmt.Errorf("bmc lan answer %q", out)
	}

	port, err := strconv.ParseUint(portStr, 10, 16)
	if err != nil {
		return "", 0, fmt.Errorf("bmc lan port %q: %w", portStr, err)
	}

	return addr, uint32(port), nil
}

// UserExists implements testagent.BMC.
func (c *bmcChannel) UserExists(name string) (bool, error) {
	if name == "" || strings.ContainsAny(name, " \n") {
		return false, nil
	}

	out, err := c.call("USER-EXISTS " + name)

	return out == "yes", err
}

// SetUser implements testagent.BMC.
func (c *bmcChannel) SetUser(name, password string) error {
	if strings.ContainsAny(name+password, " \n") {
		return fmt.Errorf("bmc user names and passwords cannot hold spaces")
	}

	_, err := c.call("SET-USER " + name + " " + password)

	return err
}

func (c *bmcChannel) reportInstalled() error {
	_, err := c.call("INSTALLED")

	return err
}
