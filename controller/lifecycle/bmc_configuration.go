package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"time"

	"github.com/cosi-project/runtime/pkg/controller"
	omnispecs "github.com/siderolabs/omni/client/api/omni/specs"
	agentpb "github.com/siderolabs/talos-metal-agent/api/agent"
	"go.uber.org/zap"
	"google.golang.org/protobuf/proto"

	"github.com/outpost-metal/outpost/controller/resources"
	"github.com/outpost-metal/outpost/controller/resources/specs"
)

// ErrInvalidBMCConfig means Omni's BMCConfig for a machine cannot be used; the machine is left alone.
var ErrInvalidBMCConfig = errors.New("invalid bmc config")

// bmcConfiguration provisions BMCConfiguration: copied from Omni's BMCConfig when the operator supplied one,
// otherwise created through the agent (an IPMI user with a random 16-character password).
type bmcConfiguration struct {
	noTeardown

	types   resources.Types
	written *written
	agent   AgentClient
	metrics *Metrics
	// rand is the source of generated passwords; secrets seals them (optional: stored in the clear).
	rand    io.Reader
	secrets Secrets
	// journal is optional (nil: none).
	journal Journal
	// ipmiUsername is the user created through the agent; callTimeout bounds each agent call; pollInterval
	// is the wait for what is outside the controller's hands.
	ipmiUsername              string
	callTimeout, pollInterval time.Duration
}

func newBMCConfigurationController(e *env, d Deps) *machineController {
	s := &bmcConfiguration{
		types: d.Types, written: e.written, agent: d.Agent, metrics: d.Metrics, rand: d.Rand, secrets: d.Secrets, journal: d.Journal,
		ipmiUsername: e.cfg.IPMIUsername, callTimeout: e.cfg.CallTimeout, pollInterval: e.cfg.PollInterval,
	}

	return callsEdge(newMachineController(e, "lifecycle.BMCConfigurationController", d.Types.BMCConfiguration, d.Types.Namespace,
		omniBMCRecord|bmcRecord|observationRecord, s))
}

func (s *bmcConfiguration) reconcile(ctx context.Context, logger *zap.Logger, r controller.QRuntime, v *view) error {
	if !v.managed() {
		return nil
	}

	if v.omniBMC != nil {
		cfg, err := fromOmni(v.omniBMC)
		if err != nil {
			// an operator error: say so, and retry slowly in case it gets fixed
			s.metrics.inc(ReasonInvalidBMCConfig)

			return controller.NewRequeueError(fmt.Errorf("bmc config of %s from omni: %w", v.id, err), 10*s.pollInterval)
		}

		if proto.Equal(v.bmc, cfg) && !v.clearBMC {
			return nil // unchanged (compared opened: a sealed value differs at every write)
		}

		return s.write(ctx, r, v.id, cfg)
	}

	if v.bmc != nil {
		if v.clearBMC {
			logger.Info("bmc password stored in the clear: sealing it")

			return s.write(ctx, r, v.id, v.bmc)
		}

		return nil // provisioned through the agent before: the credentials stay
	}

	if v.secretsErr != nil {
		// sealed with another provider key: provision new credentials through the agent, as for a new machine
		logger.Warn("stored bmc credentials cannot be opened with this controller's key; provisioning new ones through the agent",
			zap.Error(v.secretsErr))
	}

	site, ok := v.site()
	if !ok {
		return waitFor(logger, "machine not seen at any site", s.pollInterval)
	}

	if !v.agentConnected() {
		return waitFor(logger, "agent not connected", s.pollInterval)
	}

	callCtx, cancel := context.WithTimeout(ctx, s.callTimeout)
	defer cancel()

	pm, err := s.agent.GetPowerManagement(callCtx, site, v.id, &agentpb.GetPowerManagementRequest{
		Ipmi: &agentpb.GetPowerManagementRequest_IPMI{CheckUsername: s.ipmiUsername},
		Api:  &agentpb.GetPowerManagementRequest_API{},
	})
	if err != nil {
		return failedCall(s.metrics, s.pollInterval, fmt.Errorf("get power management of %s at site %s: %w", v.id, site, err))
	}

	var cfg *specs.BMCConfigurationSpec

	switch {
	case pm.GetIpmi() != nil:
		password, err := randomPassword(s.rand, 16)
		if err != nil {
			return err
		}

		if err = s.agent.SetPowerManagement(callCtx, site, v.id, &agentpb.SetPowerManagementRequest{
			Ipmi: &agentpb.SetPowerManagementRequest_IPMI{Username: s.ipmiUsername, Password: password},
		}); err != nil {
			return failedCall(s.metrics, s.pollInterval, fmt.Errorf("set power management of %s at site %s: %w", v.id, site, err))
		}

		port := pm.GetIpmi().GetPort()
		if port == 0 {
			port = 623
		}

		cfg = &specs.BMCConfigurationSpec{Source: "agent", Ipmi: &specs.BMCConfigurationSpec_IPMI{
			Address: pm.GetIpmi().GetAddress(), Port: port, Username: s.ipmiUsername, Password: password,
		}}
	case pm.GetApi() != nil:
		cfg = &specs.BMCConfigurationSpec{Source: "agent", ApiAddress: "agent"}
	default:
		return failedCall(s.metrics, s.pollInterval, fmt.Errorf("agent of %s reports no power management", v.id))
	}

	logger.Info("bmc provisioned through the agent", zap.String("site", site), zap.String("bmc_address", cfg.GetIpmi().GetAddress()))
	note(s.journal, v.id, "bmc", "BMC access provisioned through the agent")

	return s.write(ctx, r, v.id, cfg)
}

func (s *bmcConfiguration) write(ctx context.Context, r controller.QRuntime, id string, cfg *specs.BMCConfigurationSpec) error {
	stored, err := sealBMC(s.secrets, cfg)
	if err != nil {
		return err
	}

	if err := writeOwn(ctx, s.written, r, s.types.NewBMCConfiguration(id), nil, stored, func(b *resources.BMCConfiguration) {
		b.TypedSpec().Value = stored
	}); err != nil {
		return fmt.Errorf("write bmc configuration: %w", err)
	}

	return nil
}

// fromOmni validates an operator-supplied BMCConfig.
func fromOmni(c *omnispecs.InfraMachineBMCConfigSpec) (*specs.BMCConfigurationSpec, error) {
	if ipmi := c.GetIpmi(); ipmi != nil {
		addr := strings.TrimSpace(ipmi.GetAddress())

		switch {
		case addr == "" || strings.ContainsAny(addr, " /\\") || (net.ParseIP(addr) == nil && !validHostname(addr)):
			return nil, fmt.Errorf("%w: ipmi address %q", ErrInvalidBMCConfig, ipmi.GetAddress())
		case ipmi.GetPort() > 65535:
			return nil, fmt.Errorf("%w: ipmi port %d", ErrInvalidBMCConfig, ipmi.GetPort())
		case ipmi.GetUsername() == "":
			return nil, fmt.Errorf("%w: ipmi username is empty", ErrInvalidBMCConfig)
		}

		port := ipmi.GetPort()
		if port == 0 {
			port = 623
		}

		return &specs.BMCConfigurationSpec{Source: "omni", Ipmi: &specs.BMCConfigurationSpec_IPMI{
			Address: addr, Port: port, Username: ipmi.GetUsername(), Password: ipmi.GetPassword(),
		}}, nil
	}

	if api := c.GetApi(); api != nil && api.GetAddress() != "" {
		return &specs.BMCConfigurationSpec{Source: "omni", ApiAddress: api.GetAddress()}, nil
	}

	return nil, fmt.Errorf("%w: neither ipmi nor api is set", ErrInvalidBMCConfig)
}

func validHostname(h string) bool {
	if len(h) > 253 {
		return false
	}

	for _, label := range strings.Split(h, ".") {
		if label == "" || len(label) > 63 {
			return false
		}

		for _, c := range label {
			alnum := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
			if !alnum && c != '-' {
				return false
			}
		}
	}

	return true
}

const passwordAlphabet = "abcdefghijkmnopqrstuvwxyzABCDEFGHJKLMNPQRSTUVWXYZ23456789"

// randomPassword draws n characters from rand without modulo bias.
func randomPassword(rand io.Reader, n int) (string, error) {
	out := make([]byte, 0, n)
	buf := make([]byte, 1)

	limit := 256 - 256%len(passwordAlphabet)

	for len(out) < n {
		if _, err := io.ReadFull(rand, buf); err != nil {
			return "", fmt.Errorf("generate bmc password: %w", err)
		}

		if int(buf[0]) < limit {
			out = append(out, passwordAlphabet[int(buf[0])%len(passwordAlphabet)])
		}
	}

	return string(out), nil
}
