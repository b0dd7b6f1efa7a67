package status

import (
	"bytes"
	"crypto/subtle"
	"crypto/tls"
	"errors"
	"fmt"
	"html/template"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
)

// Access says who may use the controller's HTTP listener (status pages and /metrics). On loopback anyone on
// the host may; off loopback every request needs the bearer token and the listener speaks TLS.
type Access struct {
	// TokenFile holds the bearer token (at least 16 bytes; surrounding white space is ignored).
	TokenFile string
	// CertFile and KeyFile are the listener's TLS certificate and key (PEM).
	CertFile, KeyFile string
}

// ErrOffLoopback means the listener is bound off loopback without a token or TLS.
var ErrOffLoopback = errors.New("an http listener off loopback needs a token file and a tls certificate and key")

// minTokenLen is the shortest bearer token accepted.
const minTokenLen = 16

// IsLoopback reports whether addr (host:port) accepts connections from this host only. An empty host
// listens on every interface.
func IsLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}

	if host == "localhost" {
		return true
	}

	ip, err := netip.ParseAddr(host)

	return err == nil && ip.IsLoopback()
}

// Check reports settings that cannot work for a listener at addr.
func (a Access) Check(addr string) error {
	if (a.CertFile == "") != (a.KeyFile == "") {
		return errors.New("http tls: give both a certificate and a key")
	}

	if !IsLoopback(addr) && (a.TokenFile == "" || a.CertFile == "") {
		return fmt.Errorf("%w (listening at %q)", ErrOffLoopback, addr)
	}

	return nil
}

// Token reads the bearer token ("" TokenFile: none, nil).
func (a Access) Token() ([]byte, error) {
	if a.TokenFile == "" {
		return nil, nil
	}

	raw, err := os.ReadFile(a.TokenFile)
	if err != nil {
		return nil, fmt.Errorf("http token: %w", err)
	}

	tok := bytes.TrimSpace(raw)
	if len(tok) < minTokenLen || bytes.ContainsAny(tok, " \t\r\n") {
		return nil, fmt.Errorf("http token in %s: want one word of at least %d bytes", a.TokenFile, minTokenLen)
	}

	return tok, nil
}

// Listen wraps ln in TLS when a certificate is configured.
func (a Access) Listen(ln net.Listener) (net.Listener, error) {
	if a.CertFile == "" {
		return ln, nil
	}

	cert, err := tls.LoadX509KeyPair(a.CertFile, a.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("http tls: %w", err)
	}

	return tls.NewListener(ln, &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}), nil
}

// cookieName carries the token for browsers (which cannot add a header to a page or an EventSource).
const cookieName = "outpost_status"

// Guard refuses requests without the token (401), counting them, except the probes' HealthPath and
// ReadyPath. A browser logs in once at LoginPath: the
// token then travels as an HTTP-only, secure, same-site cookie.
type Guard struct {
	token  []byte
	next   http.Handler
	denied prometheus.Counter
	login  *template.Template
}

// LoginPath is where a browser gives the token.
const LoginPath = "/status/login"

// HealthPath and ReadyPath are the health and readiness checks, served without the token (to probes).
const (
	HealthPath = "/healthz"
	ReadyPath  = "/readyz"
)

// NewGuard returns next behind the token (nil token: next itself, for loopback).
func NewGuard(token []byte, next http.Handler) *Guard {
	return &Guard{
		token: token, next: next,
		denied: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "outpost", Subsystem: "http", Name: "unauthorized_requests_total",
			Help: "Requests to the controller's HTTP listener refused for a missing or wrong token.",
		}),
		login: template.Must(template.New("login").Parse(`<!doctype html><html lang="en"><head><meta charset="utf-8"><title>Outpost</title></head>
<body><form method="post" action="` + LoginPath + `"><p>{{.}}</p><label>token <input type="password" name="token" autofocus></label> <button>log in</button></form></body></html>`)),
	}
}

// Describe implements prometheus.Collector.
func (g *Guard) Describe(ch chan<- *prometheus.Desc) { g.denied.Describe(ch) }

// Collect implements prometheus.Collector.
func (g *Guard) Collect(ch chan<- prometheus.Metric) { g.denied.Collect(ch) }

// ServeHTTP implements http.Handler.
func (g *Guard) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if g.token == nil {
		g.next.ServeHTTP(w, r)

		return
	}

	switch r.URL.Path {
	case LoginPath:
		g.serveLogin(w, r)

		return
	case HealthPath, ReadyPath: // for probes; they say only whether the controller lives and acts
		g.next.ServeHTTP(w, r)

		return
	}

	if !g.allowed(r) {
		g.denied.Inc()
		w.Header().Set("WWW-Authenticate", `Bearer realm="outpost"`)

		if strings.Contains(r.Header.Get("Accept"), "text/html") {
			w.Header().Set("Content-Type", "text/html; charset=utf-8")
			w.WriteHeader(http.StatusUnauthorized)
			g.login.Execute(w, "This page needs the controller's status token.") //nolint:errcheck

			return
		}

		http.Error(w, "unauthorized: send the token as Authorization: Bearer", http.StatusUnauthorized)

		return
	}

	g.next.ServeHTTP(w, r)
}

func (g *Guard) allowed(r *http.Request) bool {
	if h, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok {
		return g.match(h)
	}

	if c, err := r.Cookie(cookieName); err == nil {
		return g.match(c.Value)
	}

	return false
}

func (g *Guard) match(s string) bool {
	return subtle.ConstantTimeCompare([]byte(strings.TrimSpace(s)), g.token) == 1
}

func (g *Guard) serveLogin(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")

	if r.Method != http.MethodPost {
		g.login.Execute(w, "") //nolint:errcheck

		return
	}

	r.Body = http.MaxBytesReader(w, r.Body, 4096)

	if err := r.ParseForm(); err != nil || !g.match(r.PostForm.Get("token")) {
		g.denied.Inc()
		w.WriteHeader(http.StatusUnauthorized)
		g.login.Execute(w, "Wrong token.") //nolint:errcheck

		return
	}

	http.SetCookie(w, &http.Cookie{
		Name: cookieName, Value: string(g.token), Path: "/", HttpOnly: true, Secure: true, SameSite: http.SameSiteStrictMode,
	})
	http.Redirect(w, r, "/status/", http.StatusSeeOther)
}
