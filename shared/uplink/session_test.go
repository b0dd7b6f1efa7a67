package uplink_test

import (
	"encoding/binary"
	"io"
	"net"
	"testing"

	"github.com/hashicorp/yamux"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"
	"golang.org/x/net/http2"
	"google.golang.org/grpc"

	"github.com/outpost-metal/outpost/shared/uplink"
)

// yamux wire format (hashicorp/yamux spec.md): a 12-byte header of version, type, flags, stream ID and
// length; a stream starts with a 256 KiB receive window, grown by window update frames.
const (
	yamuxHeaderLen     = 12
	yamuxWindowUpdate  = 1
	yamuxFlagSYN       = 1
	yamuxFlagACK       = 2
	yamuxInitialWindow = 256 << 10
)

func TestYamuxSessionGrantsStreamWindow(t *testing.T) {
	t.Parallel()

	raw, conn := net.Pipe()
	t.Cleanup(func() { raw.Close() }) //nolint:errcheck

	sess, err := yamux.Server(conn, uplink.YamuxConfig(zaptest.NewLogger(t)))
	require.NoError(t, err)
	t.Cleanup(func() { sess.Close() }) //nolint:errcheck

	// the raw end opens stream 1 as a yamux client would: a window update with SYN
	syn := make([]byte, yamuxHeaderLen)
	syn[1] = yamuxWindowUpdate
	binary.BigEndian.PutUint16(syn[2:], yamuxFlagSYN)
	binary.BigEndian.PutUint32(syn[4:], 1)

	written := make(chan error, 1)

	go func() {
		_, err := raw.Write(syn)
		written <- err
	}()

	accepted := make(chan error, 1)

	go func() {
		_, err := sess.Accept()
		accepted <- err
	}()

	// the session acknowledges the stream with the window it grants on top of the initial one
	for {
		hdr := make([]byte, yamuxHeaderLen)
		_, err := io.ReadFull(raw, hdr)
		require.NoError(t, err)

		typ, flags := hdr[1], binary.BigEndian.Uint16(hdr[2:])
		stream, length := binary.BigEndian.Uint32(hdr[4:]), binary.BigEndian.Uint32(hdr[8:])

		if typ != yamuxWindowUpdate || stream != 1 || flags&yamuxFlagACK == 0 {
			continue // a ping; no data flows toward the raw end
		}

		require.Equal(t, uint32(uplink.StreamWindow), yamuxInitialWindow+length)

		break
	}

	require.NoError(t, <-written)
	require.NoError(t, <-accepted)
}

func TestRelayDialOptionsAdvertiseWindows(t *testing.T) {
	t.Parallel()

	for _, tc := range []struct {
		name       string
		relay      bool
		callWindow uint32 // SETTINGS_INITIAL_WINDOW_SIZE; 0: not sent
		connGrowth uint32 // WINDOW_UPDATE on stream 0 right after SETTINGS; 0: none
	}{
		{name: "relay connection", relay: true, callWindow: uplink.BulkCallWindow, connGrowth: uplink.BulkConnWindow - 65535},
		{name: "default connection"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()

			a, b := net.Pipe()
			log := zaptest.NewLogger(t)

			client, err := yamux.Client(a, uplink.YamuxConfig(log))
			require.NoError(t, err)

			server, err := yamux.Server(b, uplink.YamuxConfig(log))
			require.NoError(t, err)

			var opts []grpc.DialOption
			if tc.relay {
				opts = uplink.RelayDialOptions()
			}

			peer, err := uplink.NewPeer(client, opts...)
			require.NoError(t, err)

			t.Cleanup(func() {
				peer.Close()
				server.Close() //nolint:errcheck
			})

			peer.Conn().Connect()

			stream, err := server.Accept()
			require.NoError(t, err)

			preface := make([]byte, len(http2.ClientPreface))
			_, err = io.ReadFull(stream, preface)
			require.NoError(t, err)
			require.Equal(t, http2.ClientPreface, string(preface))

			fr := http2.NewFramer(io.Discard, stream)

			frame, err := fr.ReadFrame()
			require.NoError(t, err)

			settings, ok := frame.(*http2.SettingsFrame)
			require.True(t, ok, "first frame %v is not SETTINGS", frame)

			window, sent := settings.Value(http2.SettingInitialWindowSize)
			if tc.callWindow == 0 {
				require.False(t, sent && window > 65535, "default connection advertises a %d-byte call window", window)

				return
			}

			require.True(t, sent, "no SETTINGS_INITIAL_WINDOW_SIZE")
			require.Equal(t, tc.callWindow, window)

			frame, err = fr.ReadFrame()
			require.NoError(t, err)

			update, ok := frame.(*http2.WindowUpdateFrame)
			require.True(t, ok, "frame %v after SETTINGS is not WINDOW_UPDATE", frame)
			require.Zero(t, update.StreamID)
			require.Equal(t, tc.connGrowth, update.Increment)
		})
	}
}
