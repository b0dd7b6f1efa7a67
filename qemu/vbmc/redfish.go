package vbmc

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"

	"github.com/stmcginnis/gofish/schemas"

	"github.com/outpost-metal/outpost/shared/metal"
)

// Redfish paths served by the emulator (DSP0266).
const (
	systemPath   = "/redfish/v1/Systems/1"
	settingsPath = "/redfish/v1/Systems/1/SD"
	sessionsPath = "/redfish/v1/SessionService/Sessions"
	resetPath    = "/redfish/v1/Systems/1/Actions/ComputerSystem.Reset"
)

// RedfishOptions configures the emulator.
type RedfishOptions struct {
	// User and Password are the service's own account.
	User, Password string
	// Accounts, when set, accepts further credentials: a BMC whose Redfish service and IPMI share one user
	// table takes a user created in-band over IPMI (IPMI.CheckUser) on Redfish too.
	Accounts func(user, password string) bool
	// AMI makes the system behave like AMI MegaRAC: Boot is refused on the system resource and
	// accepted only on its @Redfish.Settings object (".../SD") with a matching If-Match ETag.
	AMI bool
	// ApplyOnReset (with AMI) keeps a Boot change made through the settings object pending until
	// the next power-on or reset, as AMI firmware does; the settings object shows the pending values.
	ApplyOnReset bool
	// Media, when set, is the BMC's virtual CD: served as the manager's VirtualMedia (linked from the system too),
	// and bootable once with BootSourceOverrideTarget "Cd".
	Media *Media
	// UUID is the system's UUID (a lab machine's SMBIOS UUID); empty when not set.
	UUID string
	// Hardware, when set, is the machine's inventory: the system's vendor, model, serial, processors, memory and
	// BIOS version, a drive, an Ethernet interface, the manager's firmware and a firmware inventory.
	Hardware *Hardware
}

// Redfish is a small Redfish service for one ComputerSystem backed by a Chassis: service root,
// Systems collection, PowerState, Boot override, the ComputerSystem.Reset action and sessions.
type Redfish struct {
	ch   *Chassis
	opts RedfishOptions

	mu       sync.Mutex
	sessions map[string]string // token -> session ID
	nextID   int
	version  int // bumps on every change of the system; the ETag
	created  int
	modes    int // PATCHes that named BootSourceOverrideMode
	actions  int // boot overrides set and resets done
	pending  *Override
}

// Actions returns how many boot overrides this front end set and resets (power on, off, cycle) it did: what
// shows that a lifecycle ran over Redfish.
func (r *Redfish) Actions() int {
	r.mu.Lock()
	defer r.mu.Unlock()

	return r.actions
}

// ModePatches returns how many PATCHes named BootSourceOverrideMode (clients should send it only
// when it changes: some BMCs refuse it otherwise).
func (r *Redfish) ModePatches() int {
	r.mu.Lock()
	defer r.mu.Unlock()

	return r.modes
}

// NewRedfish returns an emulator for ch.
func NewRedfish(ch *Chassis, opts RedfishOptions) *Redfish {
	return &Redfish{ch: ch, opts: opts, sessions: map[string]string{}}
}

// Sessions returns the number of open sessions.
func (r *Redfish) Sessions() int {
	r.mu.Lock()
	defer r.mu.Unlock()

	return len(r.sessions)
}

// SessionsCreated returns how many sessions were ever created.
func (r *Redfish) SessionsCreated() int {
	r.mu.Lock()
	defer r.mu.Unlock()

	return r.created
}

// ExpireSessions forgets every session, as a BMC does after its session timeout or a reboot.
func (r *Redfish) ExpireSessions() {
	r.mu.Lock()
	defer r.mu.Unlock()

	clear(r.sessions)
}

// ServeHTTP implements http.Handler.
func (r *Redfish) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	path := strings.TrimSuffix(req.URL.Path, "/")

	switch {
	case path == "/redfish" && req.Method == http.MethodGet:
		writeJSON(w, http.StatusOK, map[string]any{"v1": "/redfish/v1/"})

		return
	case path == "/redfish/v1" && req.Method == http.MethodGet:
		writeJSON(w, http.StatusOK, r.serviceRoot())

		return
	case path == sessionsPath && req.Method == http.MethodPost:
		r.login(w, req)

		return
	}

	if !r.authorized(req) {
		w.Header().Set("WWW-Authenticate", `Basic realm="vbmc"`)
		writeError(w, http.StatusUnauthorized, "Base.1.8.NoValidSession", "authentication required")

		return
	}

	switch {
	case path == "/redfish/v1/Systems" && req.Method == http.MethodGet:
		writeJSON(w, http.StatusOK, map[string]any{
			"@odata.id":           "/redfish/v1/Systems",
			"@odata.type":         "#ComputerSystemCollection.ComputerSystemCollection",
			"Name":                "Computer System Collection",
			"Members":             []any{map[string]string{"@odata.id": systemPath}},
			"Members@odata.count": 1,
		})
	case path == systemPath && req.Method == http.MethodGet:
		r.getSystem(w, false)
	case path == systemPath && req.Method == http.MethodPatch:
		if r.opts.AMI {
			writeError(w, http.StatusMethodNotAllowed, "Base.1.8.PropertyNotWritable", "Boot is writable only through the settings object")

			return
		}

		r.patchBoot(w, req, false)
	case path == settingsPath && r.opts.AMI && req.Method == http.MethodGet:
		r.getSystem(w, true)
	case path == settingsPath && r.opts.AMI && req.Method == http.MethodPatch:
		if req.Header.Get("If-Match") != r.etag() {
			writeError(w, http.StatusPreconditionFailed, "Base.1.8.PreconditionFailed", "If-Match does not match the current ETag")

			return
		}

		r.patchBoot(w, req, r.opts.ApplyOnReset)
	case path == resetPath && req.Method == http.MethodPost:
		r.reset(w, req)
	case path == "/redfish/v1/SessionService" && req.Method == http.MethodGet:
		writeJSON(w, http.StatusOK, map[string]any{
			"@odata.id": "/redfish/v1/SessionService", "@odata.type": "#SessionService.v1_1_8.SessionService",
			"Id": "SessionService", "Name": "Session Service", "ServiceEnabled": true, "SessionTimeout": 300,
			"Sessions": map[string]string{"@odata.id": sessionsPath},
		})
	case path == sessionsPath && req.Method == http.MethodGet:
		r.listSessions(w)
	case strings.HasPrefix(path, sessionsPath+"/") && req.Method == http.MethodGet:
		writeJSON(w, http.StatusOK, map[string]any{"@odata.id": path, "@odata.type": "#Session.v1_3_0.Session",
			"Id": strings.TrimPrefix(path, sessionsPath+"/"), "Name": "Session", "UserName": r.opts.User})
	case strings.HasPrefix(path, sessionsPath+"/") && req.Method == http.MethodDelete:
		r.logout(w, strings.TrimPrefix(path, sessionsPath+"/"))
	default:
		if !r.serveHardware(w, req, path) && !r.serveMedia(w, req, path) {
			writeError(w, http.StatusNotFound, "Base.1.8.ResourceMissingAtURI", "no such resource")
		}
	}
}

func (r *Redfish) serviceRoot() map[string]any {
	root := map[string]any{
		"@odata.id":      "/redfish/v1",
		"@odata.type":    "#ServiceRoot.v1_5_0.ServiceRoot",
		"Id":             "RootService",
		"Name":           "Outpost virtual BMC",
		"RedfishVersion": "1.6.0",
		"UUID":           "0b3c0000-0000-4000-8000-000000000001",
		"Systems":        map[string]string{"@odata.id": "/redfish/v1/Systems"},
		"SessionService": map[string]string{"@odata.id": "/redfish/v1/SessionService"},
		"Links":          map[string]any{"Sessions": map[string]string{"@odata.id": sessionsPath}},
	}

	if r.opts.Media != nil {
		root["Managers"] = map[string]string{"@odata.id": managersPath}
	}

	r.hardwareRoot(root)

	return root
}

func (r *Redfish) etag() string {
	r.mu.Lock()
	defer r.mu.Unlock()

	return `W/"` + strconv.Itoa(r.version) + `"`
}

func (r *Redfish) bump() {
	r.mu.Lock()
	r.version++
	r.mu.Unlock()
}

var (
	redfishTarget = map[BootDevice]schemas.BootSource{
		BootNone: schemas.NoneBootSource, BootPXE: schemas.PxeBootSource, BootDisk: schemas.HddBootSource, BootCD: schemas.CdBootSource,
	}
	redfishMode = map[metal.Firmware]schemas.BootSourceOverrideMode{
		metal.BIOS: schemas.LegacyBootSourceOverrideMode, metal.UEFI: schemas.UEFIBootSourceOverrideMode,
	}
)

func (r *Redfish) getSystem(w http.ResponseWriter, settings bool) {
	o := r.ch.Override()

	if settings {
		r.mu.Lock()
		if r.pending != nil {
			o = *r.pending
		}
		r.mu.Unlock()
	}

	enabled := schemas.DisabledBootSourceOverrideEnabled
	if o.Device != BootNone {
		enabled = schemas.OnceBootSourceOverrideEnabled
		if o.Persistent {
			enabled = schemas.ContinuousBootSourceOverrideEnabled
		}
	}

	power := schemas.OffPowerState
	if r.ch.PowerState() {
		power = schemas.OnPowerState
	}

	id := systemPath
	if settings {
		id = settingsPath
	}

	targets := []schemas.BootSource{schemas.NoneBootSource, schemas.PxeBootSource, schemas.HddBootSource}
	if r.opts.Media != nil {
		targets = append(targets, schemas.CdBootSource)
	}

	sys := map[string]any{
		"@odata.id":   id,
		"@odata.type": "#ComputerSystem.v1_13_0.ComputerSystem",
		"Id":          "1",
		"Name":        "Virtual machine",
		"SystemType":  "Physical",
		"PowerState":  power,
		"Status":      map[string]string{"State": "Enabled", "Health": "OK"},
		"Boot": map[string]any{
			"BootSourceOverrideEnabled":                        enabled,
			"BootSourceOverrideTarget":                         redfishTarget[o.Device],
			"BootSourceOverrideMode":                           redfishMode[o.Mode],
			"BootSourceOverrideTarget@Redfish.AllowableValues": targets,
		},
		"Actions": map[string]any{
			"#ComputerSystem.Reset": map[string]any{
				"target": resetPath,
				"ResetType@Redfish.AllowableValues": []schemas.ResetType{
					schemas.OnResetType, schemas.ForceOffResetType, schemas.GracefulShutdownResetType,
					schemas.ForceRestartResetType, schemas.GracefulRestartResetType, schemas.PowerCycleResetType,
				},
			},
		},
	}

	if r.opts.UUID != "" {
		sys["UUID"] = r.opts.UUID
	}

	if !settings {
		r.hardwareSystem(sys)
	}

	if r.opts.Media != nil && !settings {
		sys["VirtualMedia"] = map[string]string{"@odata.id": mediaPath}
	}

	if r.opts.AMI && !settings {
		sys["@Redfish.Settings"] = map[string]any{
			"@odata.type":    "#Settings.v1_3_0.Settings",
			"SettingsObject": map[string]string{"@odata.id": settingsPath},
		}
	}

	w.Header().Set("ETag", r.etag())
	writeJSON(w, http.StatusOK, sys)
}

func (r *Redfish) patchBoot(w http.ResponseWriter, req *http.Request, pending bool) {
	var body struct {
		Boot *struct {
			BootSourceOverrideEnabled *schemas.BootSourceOverrideEnabled
			BootSourceOverrideTarget  *schemas.BootSource
			BootSourceOverrideMode    *schemas.BootSourceOverrideMode
		}
	}

	if err := json.NewDecoder(http.MaxBytesReader(w, req.Body, 1<<16)).Decode(&body); err != nil || body.Boot == nil {
		writeError(w, http.StatusBadRequest, "Base.1.8.MalformedJSON", "want a Boot object")

		return
	}

	o := r.ch.Override()

	r.mu.Lock()
	if pending && r.pending != nil {
		o = *r.pending
	}
	r.mu.Unlock()

	b := body.Boot

	if b.BootSourceOverrideTarget != nil {
		switch *b.BootSourceOverrideTarget {
		case schemas.NoneBootSource:
			o.Device = BootNone
		case schemas.PxeBootSource:
			o.Device = BootPXE
		case schemas.HddBootSource:
			o.Device = BootDisk
		case schemas.CdBootSource:
			if r.opts.Media == nil {
				writeError(w, http.StatusBadRequest, "Base.1.8.PropertyValueNotInList", "this bmc has no virtual media")

				return
			}

			o.Device = BootCD
		default:
			writeError(w, http.StatusBadRequest, "Base.1.8.PropertyValueNotInList", "unsupported BootSourceOverrideTarget")

			return
		}
	}

	if b.BootSourceOverrideMode != nil {
		r.mu.Lock()
		r.modes++
		r.mu.Unlock()

		switch *b.BootSourceOverrideMode {
		case schemas.LegacyBootSourceOverrideMode:
			o.Mode = metal.BIOS
		case schemas.UEFIBootSourceOverrideMode:
			o.Mode = metal.UEFI
		default:
			writeError(w, http.StatusBadRequest, "Base.1.8.PropertyValueNotInList", "unsupported BootSourceOverrideMode")

			return
		}
	}

	if b.BootSourceOverrideEnabled != nil {
		switch *b.BootSourceOverrideEnabled {
		case schemas.DisabledBootSourceOverrideEnabled:
			o.Device = BootNone
			o.Persistent = false
		case schemas.OnceBootSourceOverrideEnabled:
			o.Persistent = false
		case schemas.ContinuousBootSourceOverrideEnabled:
			o.Persistent = true
		default:
			writeError(w, http.StatusBadRequest, "Base.1.8.PropertyValueNotInList", "unsupported BootSourceOverrideEnabled")

			return
		}
	}

	if pending {
		r.mu.Lock()
		r.pending = &o
		r.mu.Unlock()
	} else {
		r.ch.SetOverride(o)
	}

	r.bump()
	r.counted()

	w.WriteHeader(http.StatusNoContent)
}

func (r *Redfish) counted() {
	r.mu.Lock()
	r.actions++
	r.mu.Unlock()
}

func (r *Redfish) reset(w http.ResponseWriter, req *http.Request) {
	var body struct{ ResetType schemas.ResetType }

	if err := json.NewDecoder(http.MaxBytesReader(w, req.Body, 1<<16)).Decode(&body); err != nil {
		writeError(w, http.StatusBadRequest, "Base.1.8.MalformedJSON", "want a ResetType")

		return
	}

	// Pending settings take effect at this reset.
	r.mu.Lock()
	if p := r.pending; p != nil {
		r.ch.SetOverride(*p)
		r.pending = nil
	}
	r.mu.Unlock()

	var err error

	switch body.ResetType {
	case schemas.OnResetType:
		err = r.ch.SetPower(req.Context(), true)
	case schemas.ForceOffResetType, schemas.GracefulShutdownResetType:
		err = r.ch.SetPower(req.Context(), false)
	case schemas.ForceRestartResetType, schemas.GracefulRestartResetType, schemas.PowerCycleResetType:
		err = r.ch.Reset(req.Context())
	default:
		writeError(w, http.StatusBadRequest, "Base.1.8.ActionParameterNotSupported", "unsupported ResetType")

		return
	}

	if err != nil {
		writeError(w, http.StatusInternalServerError, "Base.1.8.InternalError", "chassis: "+err.Error())

		return
	}

	r.bump()
	r.counted()
	w.WriteHeader(http.StatusNoContent)
}

func (r *Redfish) login(w http.ResponseWriter, req *http.Request) {
	var body struct{ UserName, Password string }

	if err := json.NewDecoder(http.MaxBytesReader(w, req.Body, 1<<16)).Decode(&body); err != nil {
		writeError(w, http.StatusBadRequest, "Base.1.8.MalformedJSON", "want UserName and Password")

		return
	}

	if !r.credentialsOK(body.UserName, body.Password) {
		writeError(w, http.StatusUnauthorized, "Base.1.8.InsufficientPrivilege", "invalid credentials")

		return
	}

	buf := make([]byte, 16)
	_, _ = rand.Read(buf) //nolint:errcheck // crypto/rand never fails
	token := hex.EncodeToString(buf)

	r.mu.Lock()
	r.nextID++
	r.created++
	id := strconv.Itoa(r.nextID)
	r.sessions[token] = id
	r.mu.Unlock()

	w.Header().Set("X-Auth-Token", token)
	w.Header().Set("Location", sessionsPath+"/"+id)
	writeJSON(w, http.StatusCreated, map[string]any{
		"@odata.id": sessionsPath + "/" + id, "@odata.type": "#Session.v1_3_0.Session",
		"Id": id, "Name": "Session", "UserName": body.UserName,
	})
}

func (r *Redfish) logout(w http.ResponseWriter, id string) {
	r.mu.Lock()
	defer r.mu.Unlock()

	for token, sid := range r.sessions {
		if sid == id {
			delete(r.sessions, token)
			w.WriteHeader(http.StatusNoContent)

			return
		}
	}

	writeError(w, http.StatusNotFound, "Base.1.8.ResourceMissingAtURI", "no such session")
}

func (r *Redfish) listSessions(w http.ResponseWriter) {
	r.mu.Lock()
	members := make([]any, 0, len(r.sessions))

	for _, id := range r.sessions {
		members = append(members, map[string]string{"@odata.id": sessionsPath + "/" + id})
	}
	r.mu.Unlock()

	writeJSON(w, http.StatusOK, map[string]any{
		"@odata.id": sessionsPath, "@odata.type": "#SessionCollection.SessionCollection", "Name": "Sessions",
		"Members": members, "Members@odata.count": len(members),
	})
}

func (r *Redfish) credentialsOK(user, password string) bool {
	u := subtle.ConstantTimeCompare([]byte(user), []byte(r.opts.User))
	p := subtle.ConstantTimeCompare([]byte(password), []byte(r.opts.Password))

	if u&p == 1 {
		return true
	}

	return r.opts.Accounts != nil && r.opts.Accounts(user, password)
}

func (r *Redfish) authorized(req *http.Request) bool {
	if token := req.Header.Get("X-Auth-Token"); token != "" {
		r.mu.Lock()
		defer r.mu.Unlock()

		_, ok := r.sessions[token]

		return ok
	}

	if user, password, ok := req.BasicAuth(); ok {
		return r.credentialsOK(user, password)
	}

	return false
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("OData-Version", "4.0")
	w.WriteHeader(code)

	_ = json.NewEncoder(w).Encode(v) //nolint:errcheck // the client went away
}

func writeError(w http.ResponseWriter, code int, id, msg string) {
	writeJSON(w, code, map[string]any{"error": map[string]any{
		"code": id, "message": msg,
		"@Message.ExtendedInfo": []any{map[string]string{"MessageId": id, "Message": msg}},
	}})
}

// String describes the emulator (for logs).
func (r *Redfish) String() string { return fmt.Sprintf("redfish vbmc (ami=%t)", r.opts.AMI) }
