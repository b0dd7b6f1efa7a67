package guestinit

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// smbiosOEMStrings is the SMBIOS structure type of OEM strings (DSP0134 7.12), which QEMU fills from
// -smbios type=11,value=...: how the lab tells a machine's /init what to run without touching the boot files
// every machine at a site shares.
const smbiosOEMStrings = 11

// maxSMBIOSEntry bounds what is read of one SMBIOS structure.
const maxSMBIOSEntry = 64 << 10

// OEMStrings returns the SMBIOS OEM strings of every type-11 structure under sysRoot/firmware/dmi/entries,
// in order (none: an empty list).
func OEMStrings(sysRoot string) ([]string, error) {
	raws, err := filepath.Glob(filepath.Join(sysRoot, "firmware", "dmi", "entries", fmt.Sprintf("%d-*", smbiosOEMStrings), "raw"))
	if err != nil {
		return nil, err
	}

	var out []string

	for _, p := range raws {
		f, err := os.Open(p)
		if err != nil {
			return nil, fmt.Errorf("read smbios oem strings: %w", err)
		}

		b, err := io.ReadAll(io.LimitReader(f, maxSMBIOSEntry))
		f.Close() //nolint:errcheck

		if err != nil {
			return nil, fmt.Errorf("read smbios oem strings: %w", err)
		}

		s, err := ParseOEMStrings(b)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}

		out = append(out, s...)
	}

	return out, nil
}

// ParseOEMStrings decodes one raw SMBIOS type-11 structure: the formatted area (type, length, handle, count)
// and then the string set, each string NUL-terminated, the set ending with a second NUL.
func ParseOEMStrings(raw []byte) ([]string, error) {
	if len(raw) < 5 || raw[0] != smbiosOEMStrings {
		return nil, errors.New("not an smbios oem strings structure")
	}

	length := int(raw[1])
	if length < 5 || length > len(raw) {
		return nil, fmt.Errorf("smbios structure length %d out of range", length)
	}

	count := int(raw[4])
	out := make([]string, 0, count)
	rest := raw[length:]

	for range count {
		s, after, ok := bytes.Cut(rest, []byte{0})
		if !ok || len(s) == 0 {
			return nil, fmt.Errorf("smbios oem strings: %d of %d present", len(out), count)
		}

		out = append(out, strings.ToValidUTF8(string(s), "?"))
		rest = after
	}

	return out, nil
}

// OEMValue returns the value of the first OEM string "key=value" (false when none has the key).
func OEMValue(oem []string, key string) (string, bool) {
	for _, s := range oem {
		if v, ok := strings.CutPrefix(s, key+"="); ok {
			return v, true
		}
	}

	return "", false
}
