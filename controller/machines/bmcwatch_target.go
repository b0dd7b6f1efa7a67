package machines

import (
	"google.golang.org/protobuf/proto"

	bmcpb "github.com/outpost-metal/outpost/shared/api/bmc"
)

// Target returns the site of a managed machine and its BMC as the edge takes it (with the credentials), for
// calls the watch lists do not make themselves (a serial console). ok is false for a machine with no BMC
// configuration yet.
func (w *WatchLists) Target(machineID string) (site string, target *bmcpb.Target, ok bool) {
	w.mu.Lock()
	defer w.mu.Unlock()

	site, ok = w.where[machineID]
	if !ok {
		return "", nil, false
	}

	t, ok := w.sites[site][machineID]
	if !ok {
		return "", nil, false
	}

	return site, proto.Clone(t).(*bmcpb.Target), true
}
