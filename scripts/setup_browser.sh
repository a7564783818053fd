#!/usr/bin/env bash
# Install Debian's headless Chromium and its ChromeDriver, for the `miniwob` env family and the `html` render
# kind. Idempotent and non-interactive; exits 0 at once when both are already installed.
#
# The browser is never given the network by mmrl: MiniWoB++ pages load from file:// and HTML renders from a
# scratch folder, with the network cut off (see sim/gui/miniwob.py and rewards/render/html.py). Selenium is told
# where the browser and driver are (MINIWOB_CHROME_BINARY / MINIWOB_CHROMEDRIVER), so Selenium Manager never
# phones home to download one.
#
# Usage: scripts/setup_browser.sh   (as root; `make test` tries it, `make setup-browser` fails loudly)
set -euo pipefail

PACKAGES=(chromium chromium-driver)
BROWSER=${MMRL_CHROMIUM:-/usr/bin/chromium}
DRIVER=${MMRL_CHROMEDRIVER:-/usr/bin/chromedriver}

say() { echo "setup_browser: $*"; }

installed() { [ -x "$BROWSER" ] && [ -x "$DRIVER" ]; }

if installed; then
    say "already installed: $("$BROWSER" --version 2>/dev/null | head -1), $("$DRIVER" --version 2>/dev/null | head -1)"
    exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
    echo "setup_browser: ERROR: Chromium and ChromeDriver ($BROWSER, $DRIVER) are needed for the miniwob env" \
        "and the html render kind, and installing them needs root. Run: sudo $0" >&2
    exit 1
fi
if ! command -v apt-get >/dev/null; then
    echo "setup_browser: ERROR: no apt-get here; install Chromium and ChromeDriver by hand and set" \
        "MMRL_CHROMIUM and MMRL_CHROMEDRIVER to their paths" >&2
    exit 1
fi

export DEBIAN_FRONTEND=noninteractive
say "apt-get update"
apt-get update -qq
say "apt-get install ${PACKAGES[*]}"
apt-get install -y -qq --no-install-recommends "${PACKAGES[@]}"

if ! installed; then
    echo "setup_browser: ERROR: installed ${PACKAGES[*]}, but $BROWSER or $DRIVER is missing" >&2
    exit 1
fi
say "installed $("$BROWSER" --version 2>/dev/null | head -1), $("$DRIVER" --version 2>/dev/null | head -1)"
