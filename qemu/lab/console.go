package lab

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"

	"go.uber.org/zap"

	"github.com/outpost-metal/outpost/qemu/vbmc"
)

// serialChardev is QEMU's -chardev of the machine's serial console: the serial log file, or with Spec.Console
// a socket the lab serves (QEMU connects at start), QEMU still appending everything the guest prints to the
// serial log.
func (m *Machine) serialChardev() string {
	if m.console == nil {
		return "file,id=con,append=on,path=" + m.Serial.Path
	}

	return "socket,id=con,path=" + m.consock + ",logfile=" + m.Serial.Path + ",logappend=on"
}

// serveConsole gives the machine's BMC its serial console: each QEMU run's connection to the console socket
// becomes the line the BMC's SOL serves.
func (m *Machine) serveConsole(ctx context.Context) error {
	m.console = vbmc.NewConsole()
	m.ipmi.SetConsole(m.console)
	m.consock = filepath.Join(m.Site.Dir, m.Spec.Name+".con.sock")

	os.Remove(m.consock) //nolint:errcheck

	ln, err := net.Listen("unix", m.consock)
	if err != nil {
		return fmt.Errorf("listen serial console of %s: %w", m.Spec.Name, err)
	}

	m.lab.Defer(func() { ln.Close() }) //nolint:errcheck

	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}

			go func() {
				if err := m.console.Serve(ctx, conn); err != nil {
					m.log.Info("serial console line ended", zap.Error(err))
				}
			}()
		}
	}()

	return nil
}
