package httpd

import (
	"net"
	"net/http"
	"strings"

	bootpb "github.com/outpost-metal/outpost/shared/api/boot"
	"github.com/outpost-metal/outpost/shared/metal"
)

// noteSignedBoot reports a GET of a machine's own signed image, named with boot.SignedBootQuery, as its boot
// served (before the image goes out: the machine's agent may dial the moment it runs). Anything else under
// /assets/ is served as it is, and a query that names another machine's image, or no machine, is no evidence.
func (s *Server) noteSignedBoot(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Only a query can name a machine: the other asset requests pass untouched.
		if s.deps.Observer != nil && r.URL.RawQuery != "" && r.Header.Get("Range") == "" {
			if b, ok := s.signedBoot(r); ok {
				s.deps.Observer.BootServed(b)
			}
		}

		next.ServeHTTP(w, r)
	})
}

// signedBoot is the boot a request for a signed image stands for, when it names a machine whose current
// plan (or its site's table, for a machine with none) gives it that image.
func (s *Server) signedBoot(r *http.Request) (BootServed, bool) {
	q := r.URL.Query()
	if !q.Has("uuid") || !q.Has("mac") || s.deps.Table == nil {
		return BootServed{}, false
	}

	id, err := metal.ParsePeerID(q.Get("uuid"))
	if err != nil {
		return BootServed{}, false
	}

	mac, err := net.ParseMAC(q.Get("mac"))
	if err != nil || len(mac) != 6 {
		return BootServed{}, false
	}

	name := strings.TrimPrefix(r.URL.Path, "/assets/")

	for _, arch := range []metal.Arch{metal.AMD64, metal.ARM64} {
		if img := s.deps.Table.SignedImage(mac, id.String(), arch); img.GetUrl() != "/assets/"+name {
			continue
		}

		e := s.deps.Table.Lookup(id, mac, arch)

		mode := ModeAgent
		if e.Mode == bootpb.Mode_MODE_INSTALL {
			mode = ModeInstall
		}

		return BootServed{UUID: id, MAC: mac, Mode: mode, Remote: remoteAddr(r), TableVersion: e.Version, SignedImage: name}, true
	}

	return BootServed{}, false
}
