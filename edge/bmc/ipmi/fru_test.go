package ipmi_test

import (
	"testing"

	"github.com/bougou/go-ipmi/pkg/types"
	"github.com/stretchr/testify/require"

	"github.com/outpost-metal/outpost/edge/bmc/ipmi"
)

// packFRU is FRU data with a board and a product area, as a BMC stores it.
func packFRU(board *types.FRUBoardInfoArea, product *types.FRUProductInfoArea) []byte {
	b, p := board.Pack(), product.Pack()
	h := types.FRUCommonHeader{FormatVersion: types.FRUFormatVersion, BoardOffset8B: 1, ProductOffset8B: uint8(1 + len(b)/8)}

	raw := h.Pack()
	sum := 0

	for _, c := range raw[:7] {
		sum += int(c)
	}

	h.Checksum = uint8(-sum)

	return append(append(h.Pack(), b...), p...)
}

func sampleFRU() []byte {
	return packFRU(&types.FRUBoardInfoArea{
		ManufacturerTypeLength: 0xC0 | 4, Manufacturer: []byte("Acme"),
		ProductNameTypeLength: 0xC0 | 6, ProductName: []byte("X11SPi"),
		SerialNumberTypeLength: 0xC0 | 5, SerialNumber: []byte("B1234"),
	}, &types.FRUProductInfoArea{
		ManufacturerTypeLength: 0xC0 | 9, Manufacturer: []byte("Acme Corp"),
		NameTypeLength: 0xC0 | 7, Name: []byte("R640-XL"),
		SerialNumberTypeLength: 0xC0 | 4, SerialNumber: []byte("S-99"),
	})
}

func TestParseFRU(t *testing.T) {
	t.Parallel()

	data := sampleFRU()

	for _, tc := range []struct {
		name    string
		data    []byte
		want    ipmi.FRU
		wantErr string
	}{
		{name: "board and product", data: data, want: ipmi.FRU{
			BoardManufacturer: "Acme", BoardProduct: "X11SPi", BoardSerial: "B1234",
			ProductManufacturer: "Acme Corp", ProductName: "R640-XL", ProductSerial: "S-99",
		}},
		{name: "empty", data: nil, wantErr: "fru common header"},
		{name: "bad checksum", data: append([]byte{1, 0, 0, 1, 0, 0, 0, 0x42}, data[8:]...), wantErr: "checksum invalid"},
		{name: "cut off before the areas", data: data[:12], wantErr: ipmi.ErrNoFRUAreas.Error()},
		{name: "product area cut off", data: data[:len(data)-3], want: ipmi.FRU{BoardManufacturer: "Acme", BoardProduct: "X11SPi", BoardSerial: "B1234"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()

			got, err := ipmi.ParseFRU(tc.data)
			if tc.wantErr != "" {
				require.ErrorContains(t, err, tc.wantErr)

				return
			}

			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}
}

// FuzzParseFRU feeds FRU data as a hostile BMC may answer it: ParseFRU must not panic, and every field it returns
// is bounded.
func FuzzParseFRU(f *testing.F) {
	f.Add(sampleFRU())
	f.Add([]byte{1, 0, 0, 1, 0, 0, 0, 0xFE, 1, 0})
	f.Add([]byte{1, 0, 0, 1, 1, 0, 0, 0xFD, 1, 1, 0, 0, 0, 0, 0, 0xFF})

	f.Fuzz(func(t *testing.T, data []byte) {
		fru, err := ipmi.ParseFRU(data)
		if err != nil {
			return
		}

		// a field holds at most 63 bytes; decoded (binary as hex, Latin 1 as UTF-8) it stays within a few times that
		for _, v := range []string{fru.BoardManufacturer, fru.BoardProduct, fru.BoardSerial, fru.BoardPartNumber, fru.ProductManufacturer,
			fru.ProductName, fru.ProductPartNumber, fru.ProductVersion, fru.ProductSerial} {
			require.LessOrEqual(t, len(v), 4*63)
		}
	})
}
