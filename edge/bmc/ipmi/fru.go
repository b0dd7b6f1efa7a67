package ipmi

import (
	"context"
	"errors"
	"fmt"

	"github.com/bougou/go-ipmi/pkg/command/storage"
	"github.com/bougou/go-ipmi/pkg/types"
)

// MaxFRUBytes bounds what is read of a FRU device: the common header and the board and product areas sit at its
// start on every BMC seen; an area past the bound is left out.
const MaxFRUBytes = 2048

// fruChunk is the bytes asked for per Read FRU Data (ipmitool's LAN default; IPMI v2.0 §34.2), halved down to
// minFRUChunk for a BMC that says it is too many.
const (
	fruChunk    = 32
	minFRUChunk = 8
)

// FRU is what the BMC's built-in FRU device (ID 0) says of the machine: its board and product info areas
// (Platform Management FRU Information Storage Definition v1.0 §11, §12). Strings are as stored (the caller
// bounds and cleans them); an area the device lacks is empty.
type FRU struct {
	BoardManufacturer, BoardProduct, BoardSerial, BoardPartNumber                      string
	ProductManufacturer, ProductName, ProductPartNumber, ProductVersion, ProductSerial string
}

// FRU reads the built-in FRU device (Get FRU Inventory Area Info, then Read FRU Data in 32-byte chunks, at most
// MaxFRUBytes) and parses its board and product areas.
func (c *Client) FRU(ctx context.Context) (FRU, error) {
	info, err := c.c.GetFRUInventoryAreaInfo(ctx, 0)
	if err != nil {
		return FRU{}, fmt.Errorf("get fru inventory area info: %w", c.fail(types.CommandGetFRUInventoryAreaInfo, err))
	}

	size := min(int(info.AreaSizeBytes), MaxFRUBytes)
	if size < int(types.FRUCommonHeaderSize) {
		return FRU{}, fmt.Errorf("read fru: %w: an inventory area of %d bytes", ErrMalformedReply, info.AreaSizeBytes)
	}

	data := make([]byte, 0, size)
	chunk := fruChunk

	for len(data) < size {
		n := min(size-len(data), chunk)

		resp, err := c.c.ReadFRUData(ctx, 0, uint16(len(data)), uint8(n))
		if re, ok := types.IsResponseError(err); ok && storage.ReadFRUDataLength2Big(re.CompletionCode()) && chunk > minFRUChunk {
			chunk /= 2 // the BMC takes smaller reads (C7h, C8h, CAh; §34.2), as ipmitool finds out

			continue
		}

		if err != nil {
			return FRU{}, fmt.Errorf("read fru data at %d: %w", len(data), c.fail(types.CommandReadFRUData, err))
		}

		if len(resp.Data) == 0 {
			break // a device shorter than it said: parse what there is
		}

		data = append(data, resp.Data[:min(len(resp.Data), n)]...)
	}

	return ParseFRU(data)
}

// ErrNoFRUAreas is returned by ParseFRU for FRU data with neither a board nor a product area that can be read.
var ErrNoFRUAreas = errors.New("fru data has no readable board or product area")

// ParseFRU reads the board and product areas of FRU data (the common header first, §8). An area that is
// truncated or malformed is left out; data without either is an error. It never panics: it is fed what a BMC
// answered.
func ParseFRU(data []byte) (FRU, error) {
	var h types.FRUCommonHeader

	if err := h.Unpack(data); err != nil {
		return FRU{}, fmt.Errorf("fru common header: %w: %d bytes", ErrMalformedReply, len(data))
	}

	if h.FormatVersion != types.FRUFormatVersion || !h.Valid() {
		return FRU{}, fmt.Errorf("fru common header: %w: format %#02x, checksum %s", ErrMalformedReply, h.FormatVersion, validity(h.Valid()))
	}

	var (
		out   FRU
		found bool
	)

	// The fixed fields are read here rather than with the library's area Unpack, which panics on some malformed
	// custom fields (found by FuzzParseFRU).
	if area := fruArea(data, h.BoardOffset8B); area != nil {
		// §11: version, length, language, 3 bytes of manufacturing date, then the fields
		if f := fruFields(area[6:], 4); len(f) > 0 {
			f = append(f, make([]string, 4-len(f))...)
			out.BoardManufacturer, out.BoardProduct, out.BoardSerial, out.BoardPartNumber = f[0], f[1], f[2], f[3]
			found = true
		}
	}

	if area := fruArea(data, h.ProductOffset8B); area != nil {
		// §12: version, length, language, then the fields
		if f := fruFields(area[3:], 5); len(f) > 0 {
			f = append(f, make([]string, 5-len(f))...)
			out.ProductManufacturer, out.ProductName, out.ProductPartNumber, out.ProductVersion, out.ProductSerial = f[0], f[1], f[2], f[3], f[4]
			found = true
		}
	}

	if !found {
		return FRU{}, ErrNoFRUAreas
	}

	return out, nil
}

func validity(ok bool) string {
	if ok {
		return "valid"
	}

	return "invalid"
}

// fruArea is the info area at offset8 (in multiples of 8 bytes) of data, nil when absent, cut off or too short to
// hold its fixed fields. Byte 1 of an area is its length in multiples of 8 bytes (§11, §12).
func fruArea(data []byte, offset8 uint8) []byte {
	start := int(offset8) * 8
	if offset8 == 0 || start+2 > len(data) {
		return nil
	}

	end := start + int(data[start+1])*8
	if end-start < 8 || end > len(data) {
		return nil
	}

	return data[start:end]
}

// fruFields decodes up to n type/length fields from the start of b (§13: bits 7:6 the type, binary, BCD plus,
// 6-bit ASCII or 8-bit ASCII + Latin 1; bits 5:0 the length), stopping at the end marker C1h or at a field that
// runs past b.
func fruFields(b []byte, n int) []string {
	var out []string

	for off := 0; len(out) < n && off < len(b); {
		tl := types.TypeLength(b[off])
		if uint8(tl) == types.FRUAreaFieldsEndMark {
			break
		}

		length := int(b[off] & 0x3f)
		if off+1+length > len(b) {
			break
		}

		s := ""
		if length > 0 {
			s = types.FRUFieldString(tl, b[off+1:off+1+length])
		}

		out = append(out, s)
		off += 1 + length
	}

	return out
}
