package assetsbench_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	ctlassets "github.com/outpost-metal/outpost/controller/assets"
	"github.com/outpost-metal/outpost/controller/sites"
	"github.com/outpost-metal/outpost/edge/assetcache"
	edgeuplink "github.com/outpost-metal/outpost/edge/uplink"
	"github.com/outpost-metal/outpost/qemu/linklab"
	assetsapi "github.com/outpost-metal/outpost/shared/api/assets"
)

const concurrentDownloads = 50

// benchSize is 20 MB in the quick mode and 200 MB with BENCH_FULL=1.
func benchSize() int64 {
	if os.Getenv("BENCH_FULL") == "1" {
		return 200 << 20
	}

	return 20 << 20
}

// fetchAll downloads url concurrentDownloads times at once and checks every length.
func fetchAll(b *testing.B, client *http.Client, url string, size int64) {
	b.Helper()

	var wg sync.WaitGroup

	errs := make(chan error, concurrentDownloads)

	for range concurrentDownloads {
		wg.Go(func() {
			resp, err := client.Get(url)
			if err != nil {
				errs <- err

				return
			}
			defer resp.Body.Close() //nolint:errcheck

			n, err := io.Copy(io.Discard, resp.Body)
			if err == nil && (n != size || resp.StatusCode != http.StatusOK) {
				err = fmt.Errorf("got %d bytes with status %d, want %d", n, resp.StatusCode, size)
			}

			if err != nil {
				errs <- err
			}
		})
	}

	wg.Wait()
	close(errs)

	for err := range errs {
		require.NoError(b, err)
	}
}

// BenchmarkAssetsHTTP compares the edge's /assets handler with Debian's nginx serving the same file,
// 50 concurrent downloads per iteration.
func BenchmarkAssetsHTTP(b *testing.B) {
	size := benchSize()
	dir := b.TempDir()
	digest := writeRandomFile(b, dir, size)

	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: concurrentDownloads, MaxConnsPerHost: concurrentDownloads}}
	b.Cleanup(client.CloseIdleConnections)

	b.Run("edge", func(b *testing.B) {
		cfg := assetcache.Default()
		cfg.Dir = filepath.Join(dir, "cache")

		store, err := assetcache.New(cfg, zap.NewNop(), nil)
		require.NoError(b, err)

		_, err = store.Import(b.Context(), writeBundle(b, dir, digest, size))
		require.NoError(b, err)

		served, err := assetcache.NewHandler(store, filepath.Join(dir, "files"))
		require.NoError(b, err)
		b.Cleanup(func() { served.Close() }) //nolint:errcheck

		mux := http.NewServeMux()
		mux.Handle("/assets/", served)

		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(b, err)

		srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}

		go srv.Serve(ln) //nolint:errcheck

		b.Cleanup(func() { srv.Close() }) //nolint:errcheck

		url := "http://" + ln.Addr().String() + "/assets/" + digest

		b.SetBytes(size * concurrentDownloads)
		b.ResetTimer()

		for b.Loop() {
			fetchAll(b, client, url, size)
		}
	})

	b.Run("nginx", func(b *testing.B) {
		addr := startNginx(b, dir)
		url := "http://" + addr + "/" + digest

		b.SetBytes(size * concurrentDownloads)
		b.ResetTimer()

		for b.Loop() {
			fetchAll(b, client, url, size)
		}
	})
}

// writeBundle writes an import bundle manifest next to the file and returns the directory.
func writeBundle(b *testing.B, dir, digest string, size int64) string {
	b.Helper()

	manifest := fmt.Sprintf(`{"version":1,"assets":[{"name":"agent/amd64/initramfs","sha256":%q,"size":%d,"path":%q}]}`, digest, size, digest)
	require.NoError(b, os.WriteFile(filepath.Join(dir, assetcache.BundleManifestName), []byte(manifest), 0o644))

	return dir
}

// startNginx runs Debian's nginx on a loopback port with a temporary configuration serving root.
func startNginx(b *testing.B, root string) string {
	b.Helper()

	bin, err := exec.LookPath("nginx")
	if err != nil {
		bin = "/usr/sbin/nginx"
		if _, err := os.Stat(bin); err != nil {
			b.Skip("nginx not installed (Debian nginx-light)")
		}
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(b, err)

	addr := ln.Addr().String()
	require.NoError(b, ln.Close())

	prefix := b.TempDir()
	conf := filepath.Join(prefix, "nginx.conf")
	user := ""

	if os.Geteuid() == 0 {
		user = "user root;"
	}

	require.NoError(b, os.WriteFile(conf, fmt.Appendf(nil, `%s
daemon off;
worker_processes 2;
pid %[2]s/nginx.pid;
error_log %[2]s/error.log warn;
events { worker_connections 1024; }
http {
  access_log off;
  sendfile on;
  tcp_nopush on;
  keepalive_requests 100000;
  client_body_temp_path %[2]s/body;
  proxy_temp_path %[2]s/proxy;
  fastcgi_temp_path %[2]s/fastcgi;
  uwsgi_temp_path %[2]s/uwsgi;
  scgi_temp_path %[2]s/scgi;
  server {
    listen %[3]s;
    root %[4]s;
  }
}
`, user, prefix, addr, root), 0o644))

	cmd := exec.Command(bin, "-p", prefix, "-c", conf)
	cmd.Stderr = os.Stderr
	require.NoError(b, cmd.Start())

	b.Cleanup(func() {
		cmd.Process.Kill() //nolint:errcheck
		cmd.Wait()         //nolint:errcheck
	})

	deadline := time.Now().Add(10 * time.Second)

	for {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close() //nolint:errcheck

			return addr
		}

		if time.Now().After(deadline) {
			logs, _ := os.ReadFile(filepath.Join(prefix, "error.log"))
			b.Fatalf("nginx did not start on %s: %v: %s", addr, err, logs)
		}

		time.Sleep(20 * time.Millisecond)
	}
}

// BenchmarkRelay compares streaming an asset through the controller's relay into an edge cache (with
// verification), over plain gRPC+TLS and over the real uplink (TLS, yamux, gRPC), with copying the same file
// over a raw TLS connection into a file.
func BenchmarkRelay(b *testing.B) {
	size := benchSize()
	dir := b.TempDir()
	digest := writeRandomFile(b, dir, size)
	srvTLS, cliTLS := selfSigned(b)

	b.Run("relay", func(b *testing.B) {
		relay, err := ctlassets.NewRelay(ctlassets.DefaultRelay(), ctlassets.DirFiles{Dir: dir},
			ctlassets.NewCatalog(assetsapi.Policy_POLICY_OFFLINE, nil),
			func(context.Context) (string, bool) { return "bench", true }, zap.NewNop())
		require.NoError(b, err)

		srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(srvTLS)))
		relay.Register(srv)

		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(b, err)

		go srv.Serve(ln) //nolint:errcheck

		b.Cleanup(srv.Stop)

		conn, err := grpc.NewClient("passthrough:///"+ln.Addr().String(), grpc.WithTransportCredentials(credentials.NewTLS(cliTLS)))
		require.NoError(b, err)

		b.Cleanup(func() { conn.Close() }) //nolint:errcheck

		src := assetcache.RelaySource{Client: assetsapi.NewAssetRelayClient(conn)}
		ref := assetcache.Ref{Name: "agent/amd64/initramfs", SHA256: digest, Size: size}

		b.SetBytes(size)
		b.ResetTimer()

		for b.Loop() {
			b.StopTimer()

			cfg := assetcache.Default()
			cfg.Dir = b.TempDir()

			store, err := assetcache.New(cfg, zap.NewNop(), nil)
			require.NoError(b, err)

			b.StartTimer()

			require.NoError(b, store.Put(b.Context(), ref, src))
		}
	})

	b.Run("relay-uplink", func(b *testing.B) {
		relay, err := ctlassets.NewRelay(ctlassets.DefaultRelay(), ctlassets.DirFiles{Dir: dir},
			ctlassets.NewCatalog(assetsapi.Policy_POLICY_OFFLINE, nil), sites.SiteFromContext, zap.NewNop())
		require.NoError(b, err)

		ctl := linklab.StartController(b, linklab.ControllerOptions{Logger: zap.NewNop(), Register: []func(grpc.ServiceRegistrar){relay.Register}})
		token := ctl.CreateSite(b, "bench", sites.TokenOptions{})

		conns := make(chan grpc.ClientConnInterface, 1)
		linklab.StartEdge(b, ctl.Addr, token, linklab.EdgeOptions{Options: edgeuplink.Options{
			Logger: zap.NewNop(),
			OnSession: []edgeuplink.SessionFunc{func(ctx context.Context, conn grpc.ClientConnInterface) error {
				conns <- conn
				<-ctx.Done()

				return nil
			}},
		}})

		src := assetcache.RelaySource{Client: assetsapi.NewAssetRelayClient(<-conns)}
		ref := assetcache.Ref{Name: "agent/amd64/initramfs", SHA256: digest, Size: size}

		b.SetBytes(size)
		b.ResetTimer()

		for b.Loop() {
			b.StopTimer()

			cfg := assetcache.Default()
			cfg.Dir = b.TempDir()

			store, err := assetcache.New(cfg, zap.NewNop(), nil)
			require.NoError(b, err)

			b.StartTimer()

			require.NoError(b, store.Put(b.Context(), ref, src))
		}
	})

	b.Run("raw-tls", func(b *testing.B) {
		ln, err := tls.Listen("tcp", "127.0.0.1:0", srvTLS)
		require.NoError(b, err)

		b.Cleanup(func() { ln.Close() }) //nolint:errcheck

		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}

				go func() {
					defer c.Close() //nolint:errcheck

					f, err := os.Open(filepath.Join(dir, digest))
					if err != nil {
						return
					}
					defer f.Close() //nolint:errcheck

					io.Copy(c, f) //nolint:errcheck
				}()
			}
		}()

		b.SetBytes(size)
		b.ResetTimer()

		for b.Loop() {
			c, err := tls.Dial("tcp", ln.Addr().String(), cliTLS)
			require.NoError(b, err)

			// like the relay, the receiver writes what it gets to a file
			out, err := os.Create(filepath.Join(b.TempDir(), "out"))
			require.NoError(b, err)

			n, err := io.Copy(out, c)
			require.NoError(b, err)
			require.Equal(b, size, n)
			require.NoError(b, out.Sync())
			require.NoError(b, out.Close())
			require.NoError(b, c.Close())
		}
	})
}
