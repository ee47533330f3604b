#!/usr/bin/env bash
# Tools the H200 image lacks, carried as .tools/: ccache (Debian 12's, with its libhiredis) behind a
# wrapper that finds its library. Run here; carry .tools to the device (see h200_reward.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .tools/ccache .git/info && touch .git/info/exclude
grep -qx "/.tools/" .git/info/exclude || echo "/.tools/" >> .git/info/exclude
tmp=$(mktemp -d); (cd "$tmp" && apt-get download ccache libhiredis0.14 >/dev/null 2>&1)
for f in "$tmp"/*.deb; do dpkg -x "$f" .tools/ccache; done
cat > .tools/ccache/ccache <<'SH'
#!/bin/sh
d=$(dirname "$(readlink -f "$0")")
LD_LIBRARY_PATH="$d/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "$d/usr/bin/ccache" "$@"
SH
chmod +x .tools/ccache/ccache
.tools/ccache/ccache --version | head -1
# libseccomp (the sandbox's system-call filter), for an image that lacks it: set OPSYNTH_LIBSECCOMP.
mkdir -p .tools/lib && cp -L /usr/lib/x86_64-linux-gnu/libseccomp.so.2 .tools/lib/libseccomp.so.2
