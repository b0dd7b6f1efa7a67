package assetcache

import "github.com/outpost-metal/outpost/shared/assetbundle"

// BundleFile is one asset to put in a bundle: its logical name and the file that holds it.
type BundleFile = assetbundle.File

// TreeFiles names every regular file under dir prefix/<path below dir> (assetbundle.TreeFiles).
func TreeFiles(prefix, dir string) ([]BundleFile, error) { return assetbundle.TreeFiles(prefix, dir) }

// WriteBundle writes a bundle made by hand into dir (assetbundle.Write).
func WriteBundle(dir string, files []BundleFile) (Bundle, error) {
	return assetbundle.Write(dir, files, "")
}
