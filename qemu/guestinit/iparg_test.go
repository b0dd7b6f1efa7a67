package guestinit_test

import (
	"testing"

	"github.com/outpost-metal/outpost/qemu/guestinit"
)

func TestParseIPArg(t *testing.T) {
	for _, tc := range []struct {
		in, addr, gw string
		ok           bool
	}{
		{"10.9.0.7::10.9.0.1:255.255.255.0::::off:10.9.0.2", "10.9.0.7/24", "10.9.0.1", true},
		{"10.9.0.7:::255.255.0.0", "10.9.0.7/16", "invalid IP", true},
		{"dhcp", "", "", false},
		{"", "", "", false},
		{"10.9.0.7::10.9.0.1:255.0.255.0", "", "", false}, // not a mask
		{"fe80::1", "", "", false},
	} {
		addr, gw, ok := guestinit.ParseIPArg(tc.in)
		if ok != tc.ok || (ok && (addr.String() != tc.addr || gw.String() != tc.gw)) {
			t.Errorf("%q: %v %v %v", tc.in, addr, gw, ok)
		}
	}
}

func FuzzParseIPArg(f *testing.F) {
	f.Add("10.9.0.7::10.9.0.1:255.255.255.0::::off")
	f.Add(":::")

	f.Fuzz(func(t *testing.T, s string) {
		if addr, _, ok := guestinit.ParseIPArg(s); ok && (!addr.Addr().Is4() || addr.Bits() > 32) {
			t.Fatalf("%q gave %v", s, addr)
		}
	})
}
