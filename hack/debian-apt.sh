# Sourced by the hack scripts that fetch Debian packages without installing them (hack/ipxe.sh,
# hack/kernel-arm64.sh). It reads the Debian archives this machine's apt already uses and runs apt-get and
# apt-cache against a private configuration under _out, so the host's sources, dpkg architectures and package
# state are never touched.

# debian_archives prints the Debian archives apt uses here, one "URI SUITE COMPONENTS..." line each, from deb822
# .sources files (the stanzas signed by Debian's archive keyring) and one-line .list files.
debian_archives() {
	local f
	for f in /etc/apt/sources.list.d/*.sources; do
		[ -e "$f" ] || continue
		awk '
			function flush() {
				if (types ~ /(^| )deb( |$)/ && signed ~ /debian-archive-keyring/)
					for (i = 1; i <= nu; i++) {
						ns = split(suites, st, /[ \t]+/)
						for (j = 1; j <= ns; j++) print u[i] " " st[j] " " comps
					}
				types = ""; signed = ""; suites = ""; comps = ""; nu = 0
			}
			/^[ \t]*$/ { flush(); next }
			/^Types:/ { sub(/^Types:[ \t]*/, ""); types = $0 }
			/^URIs:/ { sub(/^URIs:[ \t]*/, ""); nu = split($0, u, /[ \t]+/) }
			/^Suites:/ { sub(/^Suites:[ \t]*/, ""); suites = $0 }
			/^Components:/ { sub(/^Components:[ \t]*/, ""); comps = $0 }
			/^Signed-By:/ { sub(/^Signed-By:[ \t]*/, ""); signed = $0 }
			END { flush() }
		' "$f"
	done
	for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
		[ -e "$f" ] || continue
		grep -E '^deb[[:space:]]' "$f" | grep -E 'debian' | sed -E 's/^deb[[:space:]]+(\[[^]]*\][[:space:]]+)?//' || true
	done
}

# debian_apt_setup DIR ARCH LIST_FILTER writes DIR/sources.list from debian_archives, each line passed through the
# awk program LIST_FILTER (which sees "URI SUITE COMPONENTS..." and prints the URI SUITE COMPONENTS to keep), as
# ARCH entries signed by Debian's archive keyring, fetches their indexes, and sets the array `apt_opts` for
# apt-get and apt-cache. It fails, saying so, when this machine lists no Debian archive.
debian_apt_setup() {
	local dir="$1" arch="$2" filter="$3"
	mkdir -p "$dir/lists/partial" "$dir/cache/archives/partial"
	debian_archives | awk "$filter" | sort -u |
		awk -v a="$arch" '{ print "deb [arch=" a " signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] " $0 }' >"$dir/sources.list"
	if [ ! -s "$dir/sources.list" ]; then
		echo "$(basename "$0"): no Debian apt source configured on this machine" >&2
		return 2
	fi
	apt_opts=(-o "Dir::Etc::sourcelist=$dir/sources.list" -o "Dir::Etc::sourceparts=-" -o "Dir::State::Lists=$dir/lists"
		-o "Dir::Cache=$dir/cache" -o "Dir::State::status=/dev/null" -o "Debug::NoLocking=1" -o "APT::Sandbox::User=root"
		-o "APT::Architecture=$arch" -o "APT::Architectures::=$arch")
	apt-get "${apt_opts[@]}" -qq update >&2
}
