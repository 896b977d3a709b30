"""Open a page in headless Chromium over the DevTools protocol: console errors, DOM, screenshot.

Used by tests/test_browser.py and scripts/make_example_report.sh
(``python -m tests.browser_cdp PAGE.html SHOT.png``). Needs Debian's ``chromium`` and
``websocket-client``; nothing is fetched from the network (the page is a local file).
"""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    "--remote-debugging-port=0",
)


def chromium() -> str | None:
    """Path of the Chromium binary, or None when it is not installed."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


@dataclass
class PageResult:
    """What the browser saw: console/log errors, uncaught exceptions, DOM figures, a PNG."""

    errors: list[str] = field(default_factory=list)
    svg_count: int = 0
    plot_count: int = 0
    title: str = ""
    sections: list[str] = field(default_factory=list)
    headline: str = ""
    svg_text: list[str] = field(default_factory=list)
    png: bytes = b""


class _Session:
    def __init__(self, url: str) -> None:
        import websocket  # websocket-client

        self.ws = websocket.create_connection(url, timeout=30, suppress_origin=True)
        self.next_id = 0
        self.events: list[dict[str, Any]] = []

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            message = json.loads(self.ws.recv())
            if message.get("id") == self.next_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})
            self.events.append(message)

    def wait_for(self, method: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        if any(e.get("method") == method for e in self.events):
            return
        while time.monotonic() < deadline:
            message = json.loads(self.ws.recv())
            self.events.append(message)
            if message.get("method") == method:
                return
        raise TimeoutError(method)


def _port(profile: Path, process: subprocess.Popen, timeout: float = 30.0) -> int:
    marker = profile / "DevToolsActivePort"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if marker.exists():
            lines = marker.read_text().splitlines()
            if lines and lines[0].strip().isdigit():
                return int(lines[0])
        if process.poll() is not None:
            raise RuntimeError(f"chromium exited with status {process.returncode}")
        time.sleep(0.05)
    raise TimeoutError("chromium did not open its DevTools port")


def open_page(page: Path, width: int = 1280, height: int = 900) -> PageResult:
    """Load `page` (a local HTML file) and report what rendered; full-page PNG screenshot."""
    binary = chromium()
    if binary is None:
        raise FileNotFoundError("chromium is not installed")
    # chromium's helper processes may still write the profile as the browser exits:
    # the scratch profile is left behind rather than failing the check on its cleanup
    with tempfile.TemporaryDirectory(
        prefix="planner-chromium-", ignore_cleanup_errors=True
    ) as profile:
        process = subprocess.Popen(
            [binary, *FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}",
             "about:blank"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            port = _port(Path(profile), process)
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as r:
                targets = json.load(r)
            target = next(t for t in targets if t.get("type") == "page")
            session = _Session(target["webSocketDebuggerUrl"])
            for domain in ("Page", "Runtime", "Log"):
                session.call(f"{domain}.enable")
            session.call("Page.navigate", url=page.resolve().as_uri())
            session.wait_for("Page.loadEventFired")
            result = PageResult()
            figures = session.call(
                "Runtime.evaluate",
                expression=(
                    "JSON.stringify({svg: document.querySelectorAll('svg').length,"
                    " plots: document.querySelectorAll('figure.plot svg').length,"
                    " title: document.title,"
                    " sections: [...document.querySelectorAll('section')].map(s => s.id),"
                    " headline: (document.querySelector('#advice') || {innerText: ''}).innerText,"
                    " svgText: [...document.querySelectorAll('svg text')].map(t => t.textContent)})"
                ),
                returnByValue=True,
            )
            dom = json.loads(figures["result"]["value"])
            result.svg_count, result.plot_count = dom["svg"], dom["plots"]
            result.title, result.sections = dom["title"], dom["sections"]
            result.headline, result.svg_text = dom["headline"], dom["svgText"]
            metrics = session.call("Page.getLayoutMetrics")
            size = metrics.get("cssContentSize") or metrics["contentSize"]
            shot = session.call(
                "Page.captureScreenshot",
                format="png",
                captureBeyondViewport=True,
                clip={"x": 0, "y": 0, "width": size["width"], "height": size["height"],
                      "scale": 1},
            )  # fmt: skip
            result.png = base64.b64decode(shot["data"])
            for event in session.events:
                method, params = event.get("method"), event.get("params", {})
                if method == "Runtime.exceptionThrown":
                    result.errors.append(json.dumps(params.get("exceptionDetails", {}))[:300])
                elif method == "Runtime.consoleAPICalled" and params.get("type") in (
                    "error",
                    "assert",
                ):
                    result.errors.append(json.dumps(params.get("args", []))[:300])
                elif method == "Log.entryAdded" and params["entry"].get("level") == "error":
                    result.errors.append(params["entry"].get("text", ""))
            session.ws.close()
            return result
        finally:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def main(argv: list[str]) -> int:
    """``python -m tests.browser_cdp PAGE.html SHOT.png``: screenshot, exit 1 on page errors."""
    page, shot = Path(argv[0]), Path(argv[1])
    result = open_page(page)
    shot.write_bytes(result.png)
    for error in result.errors:
        print(f"page error: {error}", file=sys.stderr)
    return 1 if result.errors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
