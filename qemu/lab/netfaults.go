package lab

import "strconv"

// CutNetwork takes the machine's NIC off the site network (its tap leaves the site's bridge: nothing it sends
// reaches the edge or the site's DHCP server) or puts it back. Its BMC, on the site network itself, still
// answers.
func (m *Machine) CutNetwork(cut bool) error {
	master := []string{"master", "br0"}
	if cut {
		master = []string{"nomaster"}
	}

	return m.Site.lab.IP(append([]string{"-n", m.Site.NS, "link", "set", m.tap}, master...)...)
}

// RefuseHTTP makes the edge's address refuse the machine's HTTP (port 80, matched by its MAC) with a TCP reset:
// every connection when after is 0, else once a connection has carried after bytes to the machine (a download
// that breaks part way). The rule stays until the site is removed.
func (m *Machine) RefuseHTTP(after int64) error {
	// The machine's own resets pass: they are how the edge learns the download it was sending is over.
	args := []string{"netns", "exec", m.Site.NS, "iptables", "-A", "INPUT", "-p", "tcp", "--dport", "80",
		"!", "--tcp-flags", "RST", "RST", "-m", "mac", "--mac-source", m.Spec.MAC}

	if after > 0 {
		args = append(args, "-m", "connbytes", "--connbytes", strconv.FormatInt(after, 10)+":",
			"--connbytes-dir", "reply", "--connbytes-mode", "bytes")
	}

	return m.Site.lab.IP(append(args, "-j", "REJECT", "--reject-with", "tcp-reset")...)
}
