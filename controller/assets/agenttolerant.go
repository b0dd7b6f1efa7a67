package assets

import (
	"context"
	"errors"
)

// agentTolerant lets agent-mode profiles through when their assets cannot be resolved.
type agentTolerant struct {
	Resolver

	agentVersion string
}

// TolerateMissingAgent wraps r so that a profile of the agent's Talos version (agentTalosVersion) that r
// cannot resolve (ErrNotAvailable) resolves to its kernel arguments alone: edges boot agent mode from their
// own agent assets (the cache's agent/<arch>/ entries) with their own addresses, so only the machine's kernel
// arguments matter to such a plan.
func TolerateMissingAgent(r Resolver, agentTalosVersion string) Resolver {
	return agentTolerant{Resolver: r, agentVersion: Profile{TalosVersion: agentTalosVersion}.Normalize().TalosVersion}
}

// Resolve implements Resolver.
func (a agentTolerant) Resolve(ctx context.Context, p Profile) (Boot, error) {
	boot, err := a.Resolver.Resolve(ctx, p)
	if errors.Is(err, ErrNotAvailable) && p.Normalize().TalosVersion == a.agentVersion {
		return Boot{KernelArgs: p.KernelArgs}, nil
	}

	return boot, err
}
