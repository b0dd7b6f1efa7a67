package app

import (
	"net"
	"net/http"
	"time"

	"github.com/outpost-metal/outpost/edge/assets"
)

// factoryClient fetches assets from upstream (the image factory) under the cache policy.
func factoryClient() *http.Client {
	return &http.Client{Transport: &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           (&net.Dialer{Timeout: 15 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		TLSHandshakeTimeout:   15 * time.Second,
		ResponseHeaderTimeout: time.Minute,
		IdleConnTimeout:       90 * time.Second,
	}}
}

// cachedAssets tells the HTTP server which /assets/ names the content-addressed cache holds.
type cachedAssets struct{ store *assets.Store }

func (c cachedAssets) Has(name string) bool {
	_, err := c.store.Lookup(name)

	return err == nil
}
