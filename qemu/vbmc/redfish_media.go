package vbmc

import (
	"encoding/json"
	"errors"
	"net/http"
	"strings"
)

// Redfish paths of the manager and its virtual CD (DSP0266; VirtualMedia per DSP2046's VirtualMedia schema).
const (
	managersPath = "/redfish/v1/Managers"
	managerPath  = managersPath + "/1"
	mediaPath    = managerPath + "/VirtualMedia"
	cdPath       = mediaPath + "/CD1"
	insertPath   = cdPath + "/Actions/VirtualMedia.InsertMedia"
	ejectPath    = cdPath + "/Actions/VirtualMedia.EjectMedia"
)

// serveMedia answers the manager's and the virtual CD's paths; false when path is not one of them (or the
// service has no virtual CD).
func (r *Redfish) serveMedia(w http.ResponseWriter, req *http.Request, path string) bool {
	if r.opts.Media == nil {
		return false
	}

	switch {
	case path == managersPath && req.Method == http.MethodGet:
		writeJSON(w, http.StatusOK, map[string]any{
			"@odata.id": managersPath, "@odata.type": "#ManagerCollection.ManagerCollection", "Name": "Manager Collection",
			"Members": []any{map[string]string{"@odata.id": managerPath}}, "Members@odata.count": 1,
		})
	case path == managerPath && req.Method == http.MethodGet:
		writeJSON(w, http.StatusOK, map[string]any{
			"@odata.id": managerPath, "@odata.type": "#Manager.v1_10_0.Manager", "Id": "1", "Name": "Manager",
			"ManagerType": "BMC", "Status": map[string]string{"State": "Enabled", "Health": "OK"},
			"VirtualMedia": map[string]string{"@odata.id": mediaPath},
			"Links":        map[string]any{"ManagerForServers": []any{map[string]string{"@odata.id": systemPath}}},
		})
	case path == mediaPath && req.Method == http.MethodGet:
		writeJSON(w, http.StatusOK, map[string]any{
			"@odata.id": mediaPath, "@odata.type": "#VirtualMediaCollection.VirtualMediaCollection", "Name": "Virtual Media Services",
			"Members": []any{map[string]string{"@odata.id": cdPath}}, "Members@odata.count": 1,
		})
	case path == cdPath && req.Method == http.MethodGet:
		writeJSON(w, http.StatusOK, r.cd())
	case path == insertPath && req.Method == http.MethodPost:
		r.insertMedia(w, req)
	case path == ejectPath && req.Method == http.MethodPost:
		if err := r.opts.Media.Eject(req.Context()); err != nil {
			writeError(w, http.StatusInternalServerError, "Base.1.8.InternalError", "eject: "+err.Error())

			return true
		}

		r.counted()
		w.WriteHeader(http.StatusNoContent)
	default:
		return false
	}

	return true
}

// cd is the virtual CD's resource.
func (r *Redfish) cd() map[string]any {
	st := r.opts.Media.State()

	var image any // null when empty
	if st.Image != "" {
		image = st.Image
	}

	via, proto := "NotConnected", any(nil)
	if st.Image != "" {
		via, proto = "URI", strings.ToUpper(strings.SplitN(st.Image, ":", 2)[0])
	}

	return map[string]any{
		"@odata.id": cdPath, "@odata.type": "#VirtualMedia.v1_3_0.VirtualMedia", "Id": "CD1", "Name": "Virtual CD",
		"MediaTypes": []string{"CD", "DVD"}, "Image": image, "ImageName": imageName(st.Image),
		"Inserted": st.Inserted, "WriteProtected": true, "ConnectedVia": via,
		"TransferMethod": "Stream", "TransferProtocolType": proto,
		"Actions": map[string]any{
			"#VirtualMedia.InsertMedia": map[string]string{"target": insertPath},
			"#VirtualMedia.EjectMedia":  map[string]string{"target": ejectPath},
		},
	}
}

// insertMedia is the InsertMedia action: an http(s) image, shown to the host (Inserted true or left out) and
// write protected (true or left out).
func (r *Redfish) insertMedia(w http.ResponseWriter, req *http.Request) {
	var body struct {
		Image                string
		Inserted             *bool
		WriteProtected       *bool
		TransferProtocolType *string
	}

	if err := json.NewDecoder(http.MaxBytesReader(w, req.Body, 1<<16)).Decode(&body); err != nil {
		writeError(w, http.StatusBadRequest, "Base.1.8.MalformedJSON", "want an Image")

		return
	}

	switch {
	case body.Image == "":
		writeError(w, http.StatusBadRequest, "Base.1.8.ActionParameterMissing", "InsertMedia needs an Image")

		return
	case body.Inserted != nil && !*body.Inserted:
		writeError(w, http.StatusBadRequest, "Base.1.8.ActionParameterNotSupported", "Inserted false is not supported")

		return
	case body.WriteProtected != nil && !*body.WriteProtected:
		writeError(w, http.StatusBadRequest, "Base.1.8.ActionParameterNotSupported", "a virtual CD is write protected")

		return
	}

	err := r.opts.Media.Insert(req.Context(), body.Image)

	switch {
	case err == nil:
		r.counted()
		w.WriteHeader(http.StatusNoContent)
	case errors.Is(err, ErrBadImageURL):
		writeError(w, http.StatusBadRequest, "Base.1.8.ActionParameterValueFormatError", err.Error())
	case errors.Is(err, ErrMediaInUse):
		writeError(w, http.StatusConflict, "Base.1.8.ResourceInUse", err.Error())
	default:
		writeError(w, http.StatusInternalServerError, "Base.1.8.InternalError", err.Error())
	}
}
