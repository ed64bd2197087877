"""Open a local HTML file in headless Chromium (Debian's `chromium`) through the DevTools
protocol on a pipe (--remote-debugging-pipe: no port, no network), and report what a reader's
browser would: console errors and uncaught exceptions, resources that failed to load, every
URL the page requested, and a full-page screenshot.

Name resolution is disabled (--host-resolver-rules), so nothing but the local file and its
data: URLs can load, whatever the page asks for; the requests are recorded to show it."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CHROMIUM = ("chromium", "chromium-browser", "google-chrome")
FLAGS = (
    "--headless",
    "--disable-gpu",
    "--no-sandbox",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-default-apps",
    "--disable-domain-reliability",
    "--disable-extensions",
    "--disable-sync",
    "--host-resolver-rules=MAP * ~NOTFOUND",
    "--remote-debugging-pipe",
)


def chromium() -> str | None:
    return next((p for p in map(shutil.which, CHROMIUM) if p), None)


@dataclass
class PageLoad:
    console_errors: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)
    title: str = ""
    text: str = ""  # what the reader sees (innerText)
    all_text: str = ""  # with what is folded away (textContent)
    active: list[str] = field(default_factory=list)  # elements that run or load something
    images: int = 0
    broken_images: int = 0
    screenshot: bytes = b""


class _Pipe:
    def __init__(self, proc: subprocess.Popen, to_browser: int, from_browser: int) -> None:
        self.proc, self.wfd, self.rfd = proc, to_browser, from_browser
        self.buf = b""
        self.next_id = 0
        self.events: list[dict[str, Any]] = []

    def send(self, method: str, params: dict | None = None, session: str | None = None) -> dict:
        self.next_id += 1
        msg: dict[str, Any] = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self.wfd, json.dumps(msg).encode() + b"\0")
        while True:
            reply = self.read()
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def read(self) -> dict:
        while b"\0" not in self.buf:
            chunk = os.read(self.rfd, 1 << 20)
            if not chunk:
                raise RuntimeError("chromium closed the DevTools pipe")
            self.buf += chunk
        msg, self.buf = self.buf.split(b"\0", 1)
        return json.loads(msg)

    def wait_for(self, method: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not any(e.get("method") == method for e in self.events):
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {method} within {timeout} s")
            self.events.append(self.read())


_PROBE = """JSON.stringify({
  title: document.title,
  text: document.body ? document.body.innerText : "",
  all_text: document.body ? document.body.textContent : "",
  images: document.images.length,
  broken: Array.from(document.images).filter(i => !i.complete || i.naturalWidth === 0).length,
  active: Array.from(document.querySelectorAll("*")).filter(e =>
    ["SCRIPT", "IFRAME", "OBJECT", "EMBED", "FRAME", "BASE", "svg", "math"].includes(e.tagName)
    || Array.from(e.attributes).some(a => a.name.startsWith("on"))).map(e => e.outerHTML),
})"""


def load_page(path: Path, timeout: float = 60.0, width: int = 1280) -> PageLoad:
    """Load ``path`` (file://) and return what happened; the browser is closed afterwards."""
    exe = chromium()
    if exe is None:
        raise FileNotFoundError("no chromium on PATH (apt-get install chromium)")
    to_r, to_w = os.pipe()
    from_r, from_w = os.pipe()
    profile = tempfile.mkdtemp(prefix="trialbed-chromium-")

    def pipes_at_3_and_4() -> None:  # what --remote-debugging-pipe reads and writes
        # Copies first: one of the pipes may sit at 3 or 4 already. Runs before the child
        # closes every descriptor not in pass_fds.
        read_end, write_end = os.dup(to_r), os.dup(from_w)
        os.dup2(read_end, 3)
        os.dup2(write_end, 4)

    proc = subprocess.Popen(
        [exe, *FLAGS, f"--user-data-dir={profile}", f"--window-size={width},900", "about:blank"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=pipes_at_3_and_4,
        pass_fds=(3, 4),
    )
    os.close(to_r)
    os.close(from_w)
    pipe = _Pipe(proc, to_w, from_r)
    out = PageLoad()
    try:
        target = pipe.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = pipe.send("Target.attachToTarget", {"targetId": target, "flatten": True})[
            "sessionId"
        ]
        for domain in ("Page", "Runtime", "Log", "Network"):
            pipe.send(f"{domain}.enable", session=session)
        pipe.send("Page.navigate", {"url": path.resolve().as_uri()}, session=session)
        pipe.wait_for("Page.loadEventFired", timeout)
        probe = pipe.send(
            "Runtime.evaluate", {"expression": _PROBE, "returnByValue": True}, session=session
        )
        seen = json.loads(probe["result"]["value"])
        out.title, out.text, out.all_text = seen["title"], seen["text"], seen["all_text"]
        out.active = seen["active"]
        out.images, out.broken_images = seen["images"], seen["broken"]
        size = pipe.send("Page.getLayoutMetrics", session=session)["cssContentSize"]
        shot = pipe.send(
            "Page.captureScreenshot",
            {
                "format": "png",
                "captureBeyondViewport": True,
                "clip": {
                    "x": 0,
                    "y": 0,
                    "width": size["width"],
                    "height": size["height"],
                    "scale": 1,
                },
            },
            session=session,
        )
        out.screenshot = base64.b64decode(shot["data"])
        for e in pipe.events:
            method, params = e.get("method"), e.get("params", {})
            if method == "Runtime.exceptionThrown":
                details = params["exceptionDetails"]
                out.console_errors.append(
                    (details.get("exception") or {}).get("description") or details.get("text")
                )
            elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                out.console_errors.append(
                    " ".join(str(a.get("value", a.get("description"))) for a in params["args"])
                )
            elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
                entry = params["entry"]
                out.console_errors.append(f"{entry['text']} ({entry.get('url', '')})")
            elif method == "Network.requestWillBeSent":
                out.requests.append(params["request"]["url"])
        with contextlib.suppress(RuntimeError):  # the browser may close before replying
            pipe.send("Browser.close")
        proc.wait(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(to_w)
        os.close(from_r)
        shutil.rmtree(profile, ignore_errors=True)
    return out
