// Package sites is the controller's side of the uplink: the enrollment CA, the site registry
// (COSI resources), the TLS listener that authenticates edges and runs one yamux session per site,
// and the per-site gRPC connections the rest of the controller uses to reach edges.
//
// Every call an edge makes is served with the site identity from its client certificate in the
// context (SiteFromContext); an edge cannot name another site.
package sites
