package lifecycle

import (
	"errors"
	"fmt"
	"strings"

	"github.com/cosi-project/runtime/pkg/controller"
	omnispecs "github.com/siderolabs/omni/client/api/omni/specs"

	"github.com/outpost-metal/outpost/controller/resources/specs"
)

// Journal records what happens to machines for operators (their timelines: package timeline). It is
// optional; the lifecycle never reads it back.
type Journal interface {
	// Record notes one thing done to a machine, or an error (failed) with its reason.
	Record(machineID, kind, text string, failed bool)
	// Summarize gives the lifecycle's current view of a machine.
	Summarize(machineID string, s MachineSummary)
}

// MachineSummary is the lifecycle's view of a machine for operators.
type MachineSummary struct {
	Site string
	// Phase is one of the Phase constants.
	Phase string
	// Power is "on", "off" or "unknown".
	Power       string
	BMCAddress  string
	BMCProtocol string
	Installed   bool
	// Waiting is why the lifecycle cannot go on with the machine ("" when nothing holds it).
	Waiting string
	// Hardware names the machine as its BMC's inventory does (vendor, model, CPUs, memory), "" before a read.
	Hardware string
	// DrivenOver is the protocol the edge read the BMC's inventory over ("redfish" or "ipmi"): what the edge
	// settled on for the BMC, under the auto setting too. "" before a read.
	DrivenOver string
}

// Phases of a machine, as operators see them.
const (
	PhasePending     = "pending-acceptance"
	PhaseRejected    = "rejected"
	PhaseCordoned    = "cordoned"
	PhaseAwaitingBMC = "awaiting-bmc"
	PhaseWiping      = "wiping"
	PhaseReady       = "ready"
	PhaseInstalling  = "installing"
	PhaseInstalled   = "installed"
)

// Phases lists every phase, in lifecycle order.
func Phases() []string {
	return []string{PhasePending, PhaseRejected, PhaseCordoned, PhaseAwaitingBMC, PhaseWiping, PhaseReady, PhaseInstalling, PhaseInstalled}
}

// phase is where the machine is in its lifecycle.
func (v *view) phase() string {
	switch {
	case v.machine.GetAcceptanceStatus() == omnispecs.InfraMachineConfigSpec_REJECTED:
		return PhaseRejected
	case !v.accepted():
		return PhasePending
	case v.machine.GetCordoned():
		return PhaseCordoned
	case !v.bmcConfigured():
		return PhaseAwaitingBMC
	case v.requiresWipe():
		return PhaseWiping
	case v.installed():
		return PhaseInstalled
	case v.allocated():
		return PhaseInstalling
	default:
		return PhaseReady
	}
}

// summary is the machine's MachineSummary.
func (v *view) summary() MachineSummary {
	s := MachineSummary{Phase: v.phase(), Installed: v.installed(), Waiting: v.obs.GetWaitingReason()}
	s.Site, _ = v.site()

	switch v.powerState() {
	case specs.MachineObservationSpec_POWER_STATE_ON:
		s.Power = "on"
	case specs.MachineObservationSpec_POWER_STATE_OFF:
		s.Power = "off"
	default:
		s.Power = "unknown"
	}

	switch b := v.bmc; {
	case b.GetIpmi() != nil:
		s.BMCAddress, s.BMCProtocol = b.GetIpmi().GetAddress(), "ipmi"
	case b.GetApiAddress() != "":
		s.BMCAddress, s.BMCProtocol = b.GetApiAddress(), "api"
	}

	if v.inv.GetProtocol() != "" {
		s.Hardware, s.DrivenOver = hardwareLine(v.inv), v.inv.GetProtocol()
	}

	return s
}

// hardwareLine names a machine by its inventory in a few words: "Dell Inc. PowerEdge R650, 2 CPUs, 256 GiB"
// (what the inventory has of those).
func hardwareLine(inv *specs.MachineInventorySpec) string {
	var parts []string

	if name := strings.TrimSpace(strings.Join(strings.Fields(inv.GetManufacturer()+" "+inv.GetModel()), " ")); name != "" {
		parts = append(parts, name)
	}

	if n := inv.GetCpuCount(); n > 0 {
		parts = append(parts, fmt.Sprintf("%d CPUs", n))
	}

	if g := inv.GetMemoryGib(); g > 0 {
		parts = append(parts, fmt.Sprintf("%d GiB", g))
	}

	return strings.Join(parts, ", ")
}

// note records an entry in the machine's timeline in j, when there is a journal (j not nil).
func note(j Journal, machineID, kind, text string) {
	if j != nil {
		j.Record(machineID, kind, text, false)
	}
}

// noteError records a step's error (not a plain requeue) in the machine's timeline.
func (e *env) noteError(machineID, step string, err error) {
	if e.journal == nil || err == nil {
		return
	}

	var requeue *controller.RequeueError
	if errors.As(err, &requeue) && requeue.Err() == nil {
		return
	}

	e.journal.Record(machineID, "error", errorLine(step, err), true)
}

// errorLine is a step's error as a timeline reads it: the step, then the cause (what the far end said last,
// which the first 80 characters of a line must show), then the whole chain for whoever reads on. The chain
// begins with the machine and site the timeline already names, and, through the edge and the agent, carries
// each hop's gRPC status: the cause is the last status description in it ("desc = ..."), or the chain itself.
//
// A step that knows the cause better than the far end does says it with stated.
func errorLine(step string, err error) string {
	step = strings.TrimSuffix(strings.TrimPrefix(step, "lifecycle."), "Controller")
	chain := err.Error()

	var st *statedError
	if errors.As(err, &st) {
		return step + ": " + st.cause + " (" + strings.Replace(chain, st.cause+": ", "", 1) + ")"
	}

	const desc = "desc = "

	i := strings.LastIndex(chain, desc)
	if i < 0 {
		return step + ": " + chain
	}

	return step + ": " + chain[i+len(desc):] + " (" + chain + ")"
}

// statedError is an error with its cause in the step's own words, for the timeline.
type statedError struct {
	cause string
	err   error
}

// stated wraps err with its cause in the step's words (errors.Is and status.Code still see err).
func stated(err error, cause string) error { return &statedError{cause: cause, err: err} }

func (e *statedError) Error() string { return e.cause + ": " + e.err.Error() }

func (e *statedError) Unwrap() error { return e.err }
