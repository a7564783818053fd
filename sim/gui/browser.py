"""Headless Chromium for the envs that drive a real browser (`miniwob`, the `html` render env): where it is, whether
it is there, and how to start it cut off from the network.

The browser is Debian's `/usr/bin/chromium` with its `/usr/bin/chromedriver` (`make setup-browser` installs both;
`MMRL_CHROMIUM` and `MMRL_CHROMEDRIVER` point elsewhere), driven by Selenium, which is imported lazily here so that
`import sim` needs neither. Selenium is always given both paths, so Selenium Manager (which would download a
browser and report statistics over the network) never runs.

The network is cut off by Chromium's own flags (`CONFINED_FLAGS`): every request goes to a proxy at 127.0.0.1:9
(nothing listens there), loopback included (`<-loopback>` takes loopback out of the default bypass list), and every
host name resolves to nothing except `localhost`, which ChromeDriver's own connection needs. Background services
(component updates, sync, safe-browsing lists, QUIC) are off, and every browser gets a fresh profile in a
temporary folder, removed when it quits. Pages load from `file://`, which needs no network.

An env whose class has `unavailable = staticmethod(...)` returning a reason (a string, None when ready) is skipped,
with that reason, by the all-envs contract test where the browser is not installed.
"""

from __future__ import annotations

import atexit
import importlib.util
import os
import shutil
import tempfile
from typing import Any

DEFAULT_CHROMIUM = "/usr/bin/chromium"
DEFAULT_CHROMEDRIVER = "/usr/bin/chromedriver"
INSTALL_HINT = (
    "install them with `make setup-browser` (Debian's chromium + chromium-driver, and pip's miniwob/selenium)"
)

# Chromium flags that keep it off the network and quiet (see the module docstring).
CONFINED_FLAGS = (
    "--headless=new",
    "--disable-gpu",
    "--no-sandbox",  # running as root in a container; the page content is MiniWoB's own or sandboxed HTML
    "--proxy-server=127.0.0.1:9",
    "--proxy-bypass-list=<-loopback>",
    "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE localhost",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-default-apps",
    "--disable-extensions",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-quic",
    "--metrics-recording-only",
    "--mute-audio",
)


# Browsers started and not yet quit: quit at interpreter exit (normal exit, an exception, Ctrl-C), since a browser
# outlives its ChromeDriver and this process. A process killed by a signal leaves them running.
_LIVE: dict[int, Any] = {}


def chromium_path() -> str:
    """The Chromium binary: `MMRL_CHROMIUM`, else Debian's `/usr/bin/chromium`."""
    return os.environ.get("MMRL_CHROMIUM") or DEFAULT_CHROMIUM


def chromedriver_path() -> str:
    """The ChromeDriver binary: `MMRL_CHROMEDRIVER`, else Debian's `/usr/bin/chromedriver`."""
    return os.environ.get("MMRL_CHROMEDRIVER") or DEFAULT_CHROMEDRIVER


def browser_unavailable(packages: tuple[str, ...] = ("selenium",)) -> str | None:
    """Why a browser env cannot run here (what is missing and how to install it), or None when it can.

    Args:
        packages: The Python packages the caller needs besides the browser (`("selenium", "miniwob")` for `miniwob`).
    """
    missing = []
    for label, path, var in (
        ("Chromium", chromium_path(), "MMRL_CHROMIUM"),
        ("ChromeDriver", chromedriver_path(), "MMRL_CHROMEDRIVER"),
    ):
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            missing.append(f"{label} at {path} (set {var} to use another path)")
    missing += [f"the Python package {name!r}" for name in packages if importlib.util.find_spec(name) is None]
    if not missing:
        return None
    return f"headless Chromium is not available: missing {'; '.join(missing)}; {INSTALL_HINT}"


def start_chrome(extra_flags: tuple[str, ...] = (), implicit_wait_s: float = 0.0) -> Any:
    """Start one confined headless Chromium under ChromeDriver; return the Selenium `webdriver.Chrome`.

    The profile lives in a fresh temporary folder, removed by `quit_chrome`.

    Raises:
        RuntimeError: The browser is not installed (the message says what is missing and how to install it).
    """
    reason = browser_unavailable()
    if reason is not None:
        raise RuntimeError(reason)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="mmrl-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium_path()
    for flag in (*CONFINED_FLAGS, f"--user-data-dir={profile}", *extra_flags):
        options.add_argument(flag)
    try:
        driver = webdriver.Chrome(service=Service(executable_path=chromedriver_path()), options=options)
    except Exception:
        shutil.rmtree(profile, ignore_errors=True)
        raise
    driver.mmrl_profile = profile  # removed by quit_chrome
    _LIVE[id(driver)] = driver
    if implicit_wait_s:
        driver.implicitly_wait(implicit_wait_s)
    return driver


def quit_chrome(driver: Any) -> None:
    """Quit a browser from `start_chrome` and remove its profile folder; never raises."""
    _LIVE.pop(id(driver), None)
    try:
        driver.quit()
    except Exception:  # already gone (crashed, killed): nothing left to release but the folder
        pass
    profile = getattr(driver, "mmrl_profile", None)
    if profile:
        shutil.rmtree(profile, ignore_errors=True)


@atexit.register
def _quit_all() -> None:
    for driver in list(_LIVE.values()):
        quit_chrome(driver)


def confine_environment() -> None:
    """Point the `miniwob` package at our browser too (`MINIWOB_CHROME_BINARY` / `MINIWOB_CHROMEDRIVER`), so that
    none of its own code paths lets Selenium Manager look for one."""
    os.environ["MINIWOB_CHROME_BINARY"] = chromium_path()
    os.environ["MINIWOB_CHROMEDRIVER"] = chromedriver_path()
