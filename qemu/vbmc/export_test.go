package vbmc

import "context"

// SetFRUData stores raw FRU data (device 0) as the BMC's, whatever it holds (tests of hostile BMCs).
func (i *IPMI) SetFRUData(data []byte) error {
	return i.hal.Storage().FRU().Write(context.Background(), 0, data)
}
