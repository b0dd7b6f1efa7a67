package envflag

// NewFrom reads a given environment.
func NewFrom(vars map[string]string) *Env {
	return &Env{lookup: func(k string) (string, bool) { v, ok := vars[k]; return v, ok }}
}
