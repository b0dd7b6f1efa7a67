package machineaccess_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/outpost-metal/outpost/controller/machineaccess"
	adminpb "github.com/outpost-metal/outpost/shared/api/admin"
	bmcpb "github.com/outpost-metal/outpost/shared/api/bmc"
)

// An operator's first boot from virtual media: bad input is refused before anything reaches the edge; a good
// request mounts the image, then powers the machine on or cycles it, at the named site only.
func TestImageBootsRefuseBadInputAndCallTheSite(t *testing.T) {
	t.Parallel()

	good := &adminpb.BootFromImageRequest{
		SiteId: "s1", Mac: "52:54:00:00:00:01", BmcEndpoint: "https://10.0.0.9", BmcUsername: "admin", BmcPassword: "pw",
	}

	for name, mutate := range map[string]func(r *adminpb.BootFromImageRequest){
		"no site":              func(r *adminpb.BootFromImageRequest) { r.SiteId = "" },
		"not a MAC":            func(r *adminpb.BootFromImageRequest) { r.Mac = "52:54:00:00:00" },
		"an EUI-64":            func(r *adminpb.BootFromImageRequest) { r.Mac = "02:00:00:00:00:00:00:01" },
		"ftp endpoint":         func(r *adminpb.BootFromImageRequest) { r.BmcEndpoint = "ftp://10.0.0.9" },
		"no host":              func(r *adminpb.BootFromImageRequest) { r.BmcEndpoint = "https://" },
		"user info in the URL": func(r *adminpb.BootFromImageRequest) { r.BmcEndpoint = "https://root:pw@10.0.0.9" },
		"no user":              func(r *adminpb.BootFromImageRequest) { r.BmcUsername = "" },
	} {
		rec := &recorder{}
		req := proto.Clone(good).(*adminpb.BootFromImageRequest)
		mutate(req)

		_, err := machineaccess.NewImageBoots(newClient(rec, false), nil).BootFromImage(context.Background(), req)
		require.Equal(t, codes.InvalidArgument, status.Code(err), "%s: %v", name, err)
		require.Empty(t, rec.methods, name)
	}

	_, err := machineaccess.NewImageBoots(newClient(&recorder{}, true), nil).BootFromImage(context.Background(), good)
	require.Equal(t, codes.Unavailable, status.Code(err), "an offline site")

	rec := &recorder{}
	_, err = machineaccess.NewImageBoots(newClient(rec, false), nil).BootFromImage(context.Background(), good)
	require.NoError(t, err)
	require.Equal(t, []string{bmcpb.BMC_BootFromImage_FullMethodName, bmcpb.BMC_PowerCycle_FullMethodName}, rec.methods)
}
