package machined_test

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/cosi-project/runtime/pkg/safe"
	"github.com/siderolabs/talos/pkg/machinery/api/machine"
	"github.com/siderolabs/talos/pkg/machinery/api/storage"
	talosclient "github.com/siderolabs/talos/pkg/machinery/client"
	"github.com/siderolabs/talos/pkg/machinery/constants"
	"github.com/siderolabs/talos/pkg/machinery/resources/block"
	"github.com/siderolabs/talos/pkg/machinery/resources/hardware"
	"github.com/siderolabs/talos/pkg/machinery/role"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/outpost-metal/outpost/qemu/machined"
)

const (
	diskSize = 4 << 20
	uuid     = "0E5A1AB0-0000-4000-8000-00000000AA01"
)

// junk is what the fake disk holds before a wipe.
var junk = bytes.Repeat([]byte("outpost lab junk"), diskSize/16)

// fakeMachine writes a sysfs tree (SMBIOS, a virtio disk vda, a read-only CD-ROM sr0, a loop device) and
// /dev with vda as a regular file full of junk.
func fakeMachine(t *testing.T) (sysRoot, devDir string) {
	t.Helper()

	root := t.TempDir()
	sysRoot, devDir = filepath.Join(root, "sys"), filepath.Join(root, "dev")

	files := map[string]string{
		"class/dmi/id/product_uuid":          uuid + "\n",
		"class/dmi/id/sys_vendor":            "QEMU\n",
		"block/vda/size":                     "8192\n",
		"block/vda/ro":                       "0\n",
		"block/vda/serial":                   "lab-disk\n",
		"block/vda/queue/logical_block_size": "512\n",
		"block/vda/queue/rotational":         "1\n",
		"block/vda/device/vendor":            "0x1af4\n",
		"block/sr0/size":                     "0\n",
		"block/sr0/ro":                       "1\n",
		"block/sr0/device/model":             "QEMU DVD-ROM\n",
		"block/loop0/size":                   "2048\n",
		"block/vda1/size":                    "1\n", // a partition: no device entry of its own
	}

	for name, content := range files {
		p := filepath.Join(sysRoot, name)
		require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
		require.NoError(t, os.WriteFile(p, []byte(content), 0o644))
	}

	require.NoError(t, os.MkdirAll(devDir, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(devDir, "vda"), junk, 0o644))

	return sysRoot, devDir
}

type running struct {
	dev    string
	served chan error
}

// serve starts a stand-in on a unix socket and returns a Talos machinery client for it that sends roles.
func serve(t *testing.T, roles ...role.Role) (*talosclient.Client, *running) {
	t.Helper()

	return serveWith(t, machined.Config{}, roles...)
}

// serveWith is serve with cfg's fault hooks.
func serveWith(t *testing.T, cfg machined.Config, roles ...role.Role) (*talosclient.Client, *running) {
	t.Helper()

	sysRoot, devDir := fakeMachine(t)

	cfg.SysRoot, cfg.DevDir, cfg.Tag, cfg.Logger = sysRoot, devDir, "v1.11.5", zaptest.NewLogger(t)

	s, err := machined.New(cfg)
	require.NoError(t, err)

	sock := filepath.Join(t.TempDir(), "machine.sock")

	ln, err := net.Listen("unix", sock)
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(context.Background())
	r := &running{dev: filepath.Join(devDir, "vda"), served: make(chan error, 1)}

	go func() { r.served <- s.Serve(ctx, ln) }()

	t.Cleanup(func() {
		cancel()
		select {
		case <-r.served:
		case <-time.After(10 * time.Second):
			t.Error("Serve did not return after cancellation")
		}
	})

	c, err := talosclient.New(t.Context(), talosclient.WithUnixSocket(sock), talosclient.WithGRPCDialOptions(
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			return invoker(withRoles(ctx, roles), method, req, reply, cc, opts...)
		}),
		grpc.WithStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
			return streamer(withRoles(ctx, roles), desc, cc, method, opts...)
		}),
	))
	require.NoError(t, err)

	t.Cleanup(func() { c.Close() }) //nolint:errcheck

	return c, r
}

// withRoles adds the roles as the agent does (authz.SetMetadata: the talos-role key).
func withRoles(ctx context.Context, roles []role.Role) context.Context {
	if len(roles) == 0 {
		return ctx
	}

	return metadata.AppendToOutgoingContext(ctx, constants.APIAuthzRoleMetadataKey, role.MakeSet(roles...).Strings()[0])
}

func TestAgentReads(t *testing.T) {
	t.Parallel()

	c, _ := serve(t, role.Admin)
	ctx := t.Context()

	v, err := c.Version(ctx)
	require.NoError(t, err)
	require.Len(t, v.GetMessages(), 1, "the agent logs Messages[0]")
	require.Equal(t, "v1.11.5", v.GetMessages()[0].GetVersion().GetTag())

	si, err := safe.StateGetByID[*hardware.SystemInformation](ctx, c.COSI, hardware.SystemInformationID)
	require.NoError(t, err)
	require.Equal(t, "0e5a1ab0-0000-4000-8000-00000000aa01", si.TypedSpec().UUID)
	require.Equal(t, "QEMU", si.TypedSpec().Manufacturer)

	disks, err := safe.StateListAll[*block.Disk](ctx, c.COSI)
	require.NoError(t, err)

	got := map[string]*block.DiskSpec{}
	for d := range disks.All() {
		got[d.Metadata().ID()] = d.TypedSpec()
	}

	require.Len(t, got, 2, "vda and sr0; no loop device, no partition")
	require.Equal(t, uint64(diskSize), got["vda"].Size)
	require.Equal(t, "4 MiB", got["vda"].PrettySize)
	require.Equal(t, "lab-disk", got["vda"].Serial)
	require.Equal(t, "virtio", got["vda"].Transport)
	require.True(t, got["vda"].Rotational)
	require.False(t, got["vda"].Readonly)
	require.True(t, got["sr0"].CDROM)
	require.True(t, got["sr0"].Readonly)

	err = c.COSI.Create(ctx, block.NewDisk(block.NamespaceName, "vdz"))
	require.Error(t, err, "the state is read-only")
	require.Contains(t, err.Error(), "read-only")
}

func TestRolesChecked(t *testing.T) {
	t.Parallel()

	t.Run("none", func(t *testing.T) {
		t.Parallel()

		c, _ := serve(t)

		_, err := c.Version(t.Context())
		require.Equal(t, codes.PermissionDenied, status.Code(err), err)
	})

	t.Run("reader cannot wipe or reboot", func(t *testing.T) {
		t.Parallel()

		c, r := serve(t, role.Reader)

		_, err := c.Version(t.Context())
		require.NoError(t, err)

		err = c.BlockDeviceWipe(t.Context(), &storage.BlockDeviceWipeRequest{Devices: []*storage.BlockDeviceWipeDescriptor{{Device: "vda"}}})
		require.Equal(t, codes.PermissionDenied, status.Code(err), err)

		err = c.Reboot(t.Context(), talosclient.WithPowerCycle)
		require.Equal(t, codes.PermissionDenied, status.Code(err), err)

		requireDisk(t, r.dev, junk)
	})
}

func requireDisk(t *testing.T, path string, want []byte) {
	t.Helper()

	b, err := os.ReadFile(path)
	require.NoError(t, err)
	require.True(t, bytes.Equal(want, b), "disk contents differ from what is expected")
}

func TestBlockDeviceWipe(t *testing.T) {
	t.Parallel()

	wipe := func(c *talosclient.Client, method storage.BlockDeviceWipeDescriptor_Method, devices ...string) error {
		req := &storage.BlockDeviceWipeRequest{}
		for _, d := range devices {
			req.Devices = append(req.Devices, &storage.BlockDeviceWipeDescriptor{Device: d, Method: method, SkipVolumeCheck: true})
		}

		return c.BlockDeviceWipe(context.Background(), req)
	}

	t.Run("fast clears the first and last MiB", func(t *testing.T) {
		t.Parallel()

		c, r := serve(t, role.Admin)

		require.NoError(t, wipe(c, storage.BlockDeviceWipeDescriptor_FAST, "vda"))

		want := bytes.Clone(junk)
		clear(want[:1<<20])
		clear(want[len(want)-1<<20:])
		requireDisk(t, r.dev, want)
	})

	t.Run("zeroes clears every byte", func(t *testing.T) {
		t.Parallel()

		c, r := serve(t, role.Admin)

		require.NoError(t, wipe(c, storage.BlockDeviceWipeDescriptor_ZEROES, "vda"))
		requireDisk(t, r.dev, make([]byte, diskSize))
	})

	t.Run("a fault before the wipe leaves the disk as it was; the next call wipes", func(t *testing.T) {
		t.Parallel()

		var calls []int

		c, r := serveWith(t, machined.Config{BeforeWipe: func(_ context.Context, call int) error {
			calls = append(calls, call) // calls are serialized by the stand-in

			if call == 1 {
				return errors.New("lab fault: disk busy")
			}

			return nil
		}}, role.Admin)

		err := wipe(c, storage.BlockDeviceWipeDescriptor_ZEROES, "vda")
		require.Equal(t, codes.Unavailable, status.Code(err), "%v", err)
		require.ErrorContains(t, err, "disk busy")
		requireDisk(t, r.dev, junk)

		require.NoError(t, wipe(c, storage.BlockDeviceWipeDescriptor_ZEROES, "vda"))
		requireDisk(t, r.dev, make([]byte, diskSize))
		require.Equal(t, []int{1, 2}, calls)
	})

	for name, devices := range map[string][]string{
		"unknown device":         {"vda", "vdb"},
		"path instead of a name": {"vda", "../dev/vda"},
		"read-only cd-rom":       {"vda", "sr0"},
		"none":                   nil,
	} {
		t.Run("refused: "+name+", nothing wiped", func(t *testing.T) {
			t.Parallel()

			c, r := serve(t, role.Admin)

			err := wipe(c, storage.BlockDeviceWipeDescriptor_ZEROES, devices...)
			require.Error(t, err)
			require.NotEqual(t, codes.OK, status.Code(err))
			requireDisk(t, r.dev, junk)
		})
	}
}

func TestRebootPowerCycle(t *testing.T) {
	t.Parallel()

	c, r := serve(t, role.Admin)

	require.NoError(t, c.Reboot(t.Context(), talosclient.WithPowerCycle))

	select {
	case err := <-r.served:
		var reboot *machined.RebootError

		require.ErrorAs(t, err, &reboot)
		require.Equal(t, machine.RebootRequest_POWERCYCLE, reboot.Mode)

		r.served <- nil // for the cleanup
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return after an answered reboot")
	}
}
