"""A real ``jupyter lab`` subprocess on loopback with a token, and Debian's Chromium driven by
Python Playwright (never a downloaded browser), for the UI benchmark and tests.

Used by benchmarks/event_latency.py and tests/lab/test_lab_ui.py (benchmarks never import tests/;
the tests import this from here).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

from benchmarks._common import free_port

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class MissingComponent(RuntimeError):
    """A component the UI tests need is not installed; the message says how to install it."""


def chromium_path() -> str:
    """Path of Debian's Chromium. Raises MissingComponent naming the apt package."""
    if not (os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK)):
        raise MissingComponent(f"{CHROMIUM} is missing; install Debian's browser with "
                               f"'apt-get install chromium' (or run scripts/setup.sh)")
    return CHROMIUM


class Lab:
    """A ``jupyter lab`` server in a subprocess.

    Args:
        root_dir: the server's root directory (notebooks and scripts are relative to it).
        env: extra environment (the hyperpod-lab config/data dirs come from the caller's env).
        log_path: where the server's output goes (default: a temporary file).
        args: extra command-line options, e.g.
            ``["--HyperPodLab.secret_env_allowlist=HF_TOKEN"]`` (repeat the option for more names).

    Attributes:
        url: ``http://127.0.0.1:PORT/``; token: the server token; proc: the Popen.
    """

    def __init__(self, root_dir: str, env: dict[str, str] | None = None, log_path: str | None = None,
                 args: list[str] | None = None):
        self.root_dir = root_dir
        self.args = list(args or [])
        self.port = free_port()
        self.token = secrets.token_hex(16)
        self.url = f"http://127.0.0.1:{self.port}/"
        self._home = tempfile.mkdtemp(prefix="hyperpod-lab-lab-")
        self.env = dict(os.environ)
        # Jupyter's own state (settings such as the theme, workspaces, runtime files) stays in
        # a throwaway directory; extensions and kernels come from the venv (sys.prefix).
        self.env.update({
            "JUPYTER_CONFIG_DIR": os.path.join(self._home, "config"),
            "JUPYTER_RUNTIME_DIR": os.path.join(self._home, "runtime"),
            "JUPYTERLAB_SETTINGS_DIR": os.path.join(self._home, "settings"),
            "JUPYTERLAB_WORKSPACES_DIR": os.path.join(self._home, "workspaces"),
            "PYTHONUNBUFFERED": "1",
        })
        self.env.update(env or {})
        # no "official Jupyter news?" toast over the screenshots
        news = os.path.join(self._home, "settings", "@jupyterlab", "apputils-extension")
        os.makedirs(news)
        with open(os.path.join(news, "notification.jupyterlab-settings"), "w") as f:
            json.dump({"fetchNews": "false"}, f)
        self.log_path = log_path or os.path.join(self._home, "lab.log")
        self.proc: subprocess.Popen | None = None

    def start(self, timeout_s: float = 90.0) -> "Lab":
        """Start the server and wait until ``/api/status`` answers. Raises RuntimeError with
        the server's log tail when it does not come up."""
        argv = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip", "127.0.0.1",
                f"--port={self.port}", "--port-retries=0", f"--ServerApp.root_dir={self.root_dir}",
                f"--IdentityProvider.token={self.token}",
                "--ServerApp.allow_unauthenticated_access=False",
                "--LabApp.news_url=None",
                "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
                "--LabApp.expose_app_in_browser=True", *self.args]
        if os.geteuid() == 0:  # the CI machine runs as root
            argv.append("--allow-root")
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(argv, cwd=self.root_dir, env=self.env, stdin=subprocess.DEVNULL, stdout=self._log,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"jupyter lab exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                self.get("api/status")
                return self
            except (urllib.error.URLError, ConnectionError, OSError):
                time.sleep(0.3)
        raise RuntimeError(f"jupyter lab did not answer within {timeout_s} s:\n{self.log_tail()}")

    def get(self, path: str, timeout_s: float = 10.0):
        """GET ``path`` (below the base URL) with the token; the parsed JSON body."""
        req = urllib.request.Request(self.url + path, headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            return json.loads(r.read() or b"null")

    def post(self, path: str, body: dict, timeout_s: float = 60.0):
        """POST JSON to ``path`` with the token (token auth needs no XSRF cookie)."""
        req = urllib.request.Request(self.url + path, data=json.dumps(body).encode(), method="POST",
                                     headers={"Authorization": f"token {self.token}",
                                              "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            return json.loads(r.read() or b"null")

    def lab_url(self, path: str = "lab") -> str:
        """URL of the Lab page, with a fresh workspace (``?reset``) and the token."""
        return f"{self.url}{path}?reset&token={self.token}"

    def log_tail(self, n: int = 4000) -> str:
        try:
            with open(self.log_path, "rb") as f:
                return f.read()[-n:].decode(errors="replace")
        except OSError:
            return ""

    def cpu_seconds(self) -> float:
        """User + system CPU seconds of the server process so far (/proc/<pid>/stat)."""
        with open(f"/proc/{self.proc.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        """Stop the server (SIGTERM to its session, then SIGKILL) and its kernels."""
        if self.proc is None:
            return
        import signal

        for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
            if self.proc.poll() is not None:
                break
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.proc.wait(wait)
            except subprocess.TimeoutExpired:
                continue
        self._log.close()
        shutil.rmtree(self._home, ignore_errors=True)

    def __enter__(self) -> "Lab":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def launch_chromium(playwright):
    """Debian's Chromium through Playwright (headless). Raises MissingComponent when absent."""
    return playwright.chromium.launch(executable_path=chromium_path(), headless=True, args=CHROMIUM_ARGS)


def open_lab(context, lab: Lab, timeout_ms: int = 60000):
    """A new page with Lab loaded and its HyperPod sidebar opened."""
    page = context.new_page()
    page.goto(lab.lab_url(), wait_until="domcontentloaded", timeout=timeout_ms)
    page.wait_for_selector("#jp-main-dock-panel", timeout=timeout_ms)
    open_sidebar(page, timeout_ms)
    return page


def open_sidebar(page, timeout_ms: int = 30000) -> None:
    """Activate the HyperPod panel through its palette command (the app is exposed as
    ``window.jupyterapp`` by ``--LabApp.expose_app_in_browser``)."""
    page.wait_for_function("() => window.jupyterapp && window.jupyterapp.commands.hasCommand('hyperpod:open')",
                           timeout=timeout_ms)
    # The layout restorer may collapse the left area after an early activation (seen once in
    # CI: the panel stayed hidden for 60 s), so wait for it, then activate until visible.
    page.evaluate("() => window.jupyterapp.restored.then(() => null)")
    deadline = time.monotonic() + timeout_ms / 1000
    while True:
        page.evaluate("() => window.jupyterapp.commands.execute('hyperpod:open')")
        left_ms = int((deadline - time.monotonic()) * 1000)
        try:
            page.wait_for_selector("[data-testid=hp-sidebar]", state="visible",
                                   timeout=max(1, min(5000, left_ms)))
            return
        except Exception as e:  # playwright's TimeoutError; the module is imported lazily
            if left_ms <= 5000 or type(e).__name__ != "TimeoutError":
                raise


def run_command(page, command: str, args: dict | None = None):
    """Execute a Lab command in the page; returns its (JSON-able) result."""
    return page.evaluate("([c, a]) => window.jupyterapp.commands.execute(c, a).then(() => null)",
                         [command, args or {}])
