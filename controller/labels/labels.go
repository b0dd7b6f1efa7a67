// Package labels holds the machine labels the controller publishes to Omni on each machine's
// InfraMachineStatus: the site a machine is at, labels an operator sets per site, provider-wide static labels
// and the machine's hardware inventory as its BMC reports it. Omni copies them onto its own MachineStatus as omni.sidero.dev/infra-provider/<provider-id>/<key>,
// where MachineClass selectors see them. Keys and values follow the label syntax Omni (and Kubernetes)
// accept; anything else is refused where the operator set it.
package labels

import (
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"

	"github.com/spf13/pflag"
)

// Site is the key of the label naming the machine's site.
const Site = "site"

// Alert is the key of the label saying something is wrong with the machine's identity at its site (another
// host or a clone asked for its agent tunnel, another site claimed it); absent when nothing is.
const Alert = "outpost-alert"

// systemPrefix is Omni's own label prefix: Omni skips such labels on an InfraMachineStatus.
const systemPrefix = "omni.sidero.dev/"

var (
	namePattern   = regexp.MustCompile(`^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$`)
	prefixPattern = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?(\.[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)*$`)
	valuePattern  = regexp.MustCompile(`^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$`)
)

// ValidateKey reports a label key Omni would refuse or ignore.
func ValidateKey(key string) error {
	if strings.HasPrefix(key, systemPrefix) {
		return fmt.Errorf("label key %q: the %s prefix is Omni's own", key, systemPrefix)
	}

	name := key
	if prefix, rest, ok := strings.Cut(key, "/"); ok {
		if len(prefix) > 253 || !prefixPattern.MatchString(prefix) {
			return fmt.Errorf("label key %q: prefix %q is not a DNS subdomain", key, prefix)
		}

		name = rest
	}

	if !namePattern.MatchString(name) {
		return fmt.Errorf("label key %q: the name must be 1-63 characters of a-z, A-Z, 0-9, '-', '_', '.', starting and ending alphanumeric", key)
	}

	return nil
}

// ValidateValue reports a label value Omni would refuse.
func ValidateValue(value string) error {
	if !valuePattern.MatchString(value) {
		return fmt.Errorf("label value %q: at most 63 characters of a-z, A-Z, 0-9, '-', '_', '.', starting and ending alphanumeric", value)
	}

	return nil
}

// Parse reads "k=v" pairs (a flag's values); every pair is checked, and one bad pair refuses them all.
func Parse(pairs []string) (map[string]string, error) {
	out := map[string]string{}

	for _, p := range pairs {
		k, v, ok := strings.Cut(strings.TrimSpace(p), "=")
		if !ok {
			return nil, fmt.Errorf("label %q: want key=value", p)
		}

		if err := ValidateKey(k); err != nil {
			return nil, err
		}

		if err := ValidateValue(v); err != nil {
			return nil, err
		}

		switch k {
		case Site:
			return nil, fmt.Errorf("label key %q is set by the controller to the machine's site", k)
		case Alert:
			return nil, fmt.Errorf("label key %q is set by the controller when a machine's identity is contested", k)
		}

		out[k] = v
	}

	return out, nil
}

// Pairs is labels as "k=v" pairs sorted by key, the form Parse reads.
func Pairs(labels map[string]string) []string {
	out := make([]string, 0, len(labels))

	for _, k := range slices.Sorted(maps.Keys(labels)) {
		out = append(out, k+"="+labels[k])
	}

	return out
}

// Flag is m as a flag value (pflag.Value) taking comma-separated key=value pairs, each checked as Parse checks
// them, so that a configuration holds the labels parsed. The first use replaces the default; later uses add.
func Flag(m *map[string]string) pflag.Value { return &labelsFlag{m: m} }

type labelsFlag struct {
	m   *map[string]string
	set bool
}

func (f *labelsFlag) String() string { return strings.Join(Pairs(*f.m), ",") }

func (f *labelsFlag) Set(s string) error {
	var pairs []string
	if s != "" {
		pairs = strings.Split(s, ",")
	}

	parsed, err := Parse(pairs)
	if err != nil {
		return err
	}

	if !f.set {
		*f.m, f.set = map[string]string{}, true
	}

	maps.Copy(*f.m, parsed)

	return nil
}

func (*labelsFlag) Type() string { return "labels" }

// Machine returns the labels of a machine at site: its inventory labels, then the static labels and the site's
// own (an operator's word wins over the BMC's, the site's over the provider's), then the site label (which
// always says where the machine is) and the alert label when alert is set. site may be empty (not located yet).
func Machine(inventory, static, siteLabels map[string]string, site, alert string) map[string]string {
	out := maps.Clone(inventory)
	if out == nil {
		out = map[string]string{}
	}

	maps.Copy(out, static)
	maps.Copy(out, siteLabels)

	if site != "" {
		out[Site] = site
	}

	if alert != "" {
		out[Alert] = alert
	}

	return out
}

// Apply makes the non-system labels in current exactly want: the caller's set function adds or changes,
// remove drops. System labels (omni.sidero.dev/...) are left alone.
func Apply(current map[string]string, want map[string]string, set func(k, v string), remove func(k string)) {
	for _, k := range slices.Sorted(maps.Keys(current)) {
		if _, keep := want[k]; !keep && !strings.HasPrefix(k, systemPrefix) {
			remove(k)
		}
	}

	for _, k := range slices.Sorted(maps.Keys(want)) {
		if v, ok := current[k]; !ok || v != want[k] {
			set(k, want[k])
		}
	}
}
