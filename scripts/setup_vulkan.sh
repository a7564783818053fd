#!/usr/bin/env bash
# Install a software Vulkan driver (Mesa's lavapipe) new enough for SAPIEN, so ManiSkill 3 can render camera
# images on a machine without a GPU. Idempotent and non-interactive; exits 0 at once when already installed.
#
# Why backports: SAPIEN 3 refuses Debian 12's own Mesa 22 lavapipe; Mesa 25 from bookworm-backports works
# (docs/maniskill.md). Mesa is selected at run time with
#   VK_ICD_FILENAMES=/usr/share/vulkan/icd.d/lvp_icd.json
# which sim/robotics/maniskill.py sets by itself when the variable is unset and the file exists.
#
# Usage: scripts/setup_vulkan.sh   (as root; `make setup` calls it)
set -euo pipefail

MIN_MESA=24  # oldest Mesa major version whose lavapipe SAPIEN accepted in our tests (22 is refused)
SUITE=bookworm-backports
SOURCE_FILE=/etc/apt/sources.list.d/bookworm-backports.sources
PACKAGES=(mesa-vulkan-drivers libvulkan1)

say() { echo "setup_vulkan: $*"; }

lavapipe_icd() {
    # Mesa 25 names it lvp_icd.json; older Debian packages lvp_icd.<arch>.json (lvp_icd.x86_64.json, ...).
    local f
    for f in /usr/share/vulkan/icd.d/lvp_icd.json /usr/share/vulkan/icd.d/lvp_icd.*.json; do
        [ -e "$f" ] && { echo "$f"; return 0; }
    done
    return 1
}

mesa_version() { dpkg-query -W -f='${Version}' mesa-vulkan-drivers 2>/dev/null || true; }

installed() {
    local version
    version=$(mesa_version)
    [ -n "$version" ] || return 1
    dpkg --compare-versions "$version" ge "$MIN_MESA" || return 1
    dpkg-query -W -f='${Status}' libvulkan1 2>/dev/null | grep -q 'install ok installed' || return 1
    lavapipe_icd >/dev/null
}

if installed; then
    say "already installed: mesa-vulkan-drivers $(mesa_version), ICD $(lavapipe_icd)"
    exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
    version=$(mesa_version)
    echo "setup_vulkan: ERROR: a software Vulkan driver (mesa-vulkan-drivers >= $MIN_MESA) is needed for" \
        "ManiSkill camera images, and installing it needs root." >&2
    echo "setup_vulkan: found mesa-vulkan-drivers: ${version:-not installed}." \
        "Run: sudo $0" >&2
    exit 1
fi

if ! grep -q '^VERSION_CODENAME=bookworm' /etc/os-release 2>/dev/null; then
    # Other releases: trixie and later ship a new enough Mesa in their main suite.
    say "not Debian 12 (bookworm); installing ${PACKAGES[*]} from the default suites"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${PACKAGES[@]}"
    installed || { echo "setup_vulkan: ERROR: installed, but no Mesa >= $MIN_MESA lavapipe found" >&2; exit 1; }
    say "installed mesa-vulkan-drivers $(mesa_version), ICD $(lavapipe_icd)"
    exit 0
fi

export DEBIAN_FRONTEND=noninteractive
# Add the backports suite only if no enabled source names it already (*.list or deb822 *.sources).
if grep -rqs --include='*.list' --include='*.sources' "$SUITE" /etc/apt/sources.list /etc/apt/sources.list.d/; then
    say "apt source for $SUITE already present"
else
    say "adding apt source $SOURCE_FILE"
    cat >"$SOURCE_FILE" <<EOF
# Added by mmrl scripts/setup_vulkan.sh: Mesa 25 (lavapipe) for SAPIEN / ManiSkill 3 rendering on CPU.
Types: deb
URIs: http://deb.debian.org/debian
Suites: $SUITE
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
fi

say "apt-get update"
apt-get update -qq
say "apt-get install -t $SUITE ${PACKAGES[*]}"
apt-get install -y -qq --no-install-recommends -t "$SUITE" "${PACKAGES[@]}"

if ! installed; then
    echo "setup_vulkan: ERROR: installed packages, but found mesa-vulkan-drivers '$(mesa_version)'" \
        "(need >= $MIN_MESA) and ICD '$(lavapipe_icd || echo none)'" >&2
    exit 1
fi
say "installed mesa-vulkan-drivers $(mesa_version), ICD $(lavapipe_icd)"
