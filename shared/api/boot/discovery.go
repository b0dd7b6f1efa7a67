package boot

import "fmt"

// discoveryNames are the names an operator and an edge's --discovery use for each policy.
var discoveryNames = map[Discovery]string{
	Discovery_DISCOVERY_UNSPECIFIED: "",
	Discovery_DISCOVERY_ALL:         "all",
	Discovery_DISCOVERY_KNOWN:       "known",
	Discovery_DISCOVERY_OFF:         "off",
}

// ParseDiscovery maps a policy's name (all, known, off; empty for none, the edge's own) to the table's value.
func ParseDiscovery(name string) (Discovery, error) {
	for d, n := range discoveryNames {
		if n == name {
			return d, nil
		}
	}

	return 0, fmt.Errorf("discovery %q: want all, known or off", name)
}

// Policy is the policy's name (all, known, off), "" for none or a value this build does not know.
func (d Discovery) Policy() string { return discoveryNames[d] }
