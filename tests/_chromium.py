"""A headless Chromium driven over the DevTools protocol on a pipe (test
helper, not package code; the README screenshot script uses it too).

``--remote-debugging-pipe`` makes Chromium read protocol messages from fd
3 and write its own to fd 4, each a JSON object followed by a NUL byte --
no port, no websocket, nothing but the standard library.  Every wait is
bounded; `Chromium.close` (or leaving the ``with``) ends the browser,
kills it if it does not go, reaps it and removes its fresh profile.

    with Chromium() as browser:
        page = browser.open("file:///tmp/report.html")
        page.evaluate("document.title")
        png = page.screenshot()
        browser.problems  # console errors, exceptions, error log entries
"""

import base64
import json
import os
import select
import shutil
import struct
import subprocess
import tempfile
import time

BINARY = "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--remote-debugging-pipe"]
INSTALL = "install it with `apt-get install -y chromium` (Debian's package)"


class ChromiumError(Exception):
    """Chromium did not start, answer, or do what it was asked in time."""


def find_binary():
    """The Chromium to use, or None: ``$CHROMIUM``, else Debian's, else
    one on the PATH."""
    for path in (os.environ.get("CHROMIUM"), BINARY,
                 shutil.which("chromium")):
        if path and os.access(path, os.X_OK):
            return path
    return None


def png_size(data):
    """``(width, height)`` of PNG bytes; ChromiumError if not a PNG."""
    if data[:8] != b"\x89PNG\r\n\x1a\n" or data[12:16] != b"IHDR":
        raise ChromiumError("not a PNG")
    return struct.unpack(">II", data[16:24])


class Chromium:
    """One headless browser with a fresh profile, driven over a pipe."""

    def __init__(self, binary=None, timeout=30.0):
        self.binary = binary or find_binary()
        if self.binary is None:
            raise ChromiumError(f"no Chromium at {BINARY}; {INSTALL}")
        self.timeout = timeout
        self.problems = []       # console errors, exceptions, error logs
        self._events, self._buffer, self._next_id = [], b"", 0
        self.profile = tempfile.mkdtemp(prefix="report-chromium-")
        to_child, self._out = os.pipe()
        self._in, from_child = os.pipe()
        log = open(os.path.join(self.profile, "stderr.log"), "wb")
        try:
            self.process = subprocess.Popen(
                [self.binary, *FLAGS, f"--user-data-dir={self.profile}",
                 "about:blank"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                pass_fds=(3, 4), start_new_session=True,
                preexec_fn=lambda: _as_fds_3_and_4(to_child, from_child))
        except BaseException:
            for fd in (self._in, self._out):
                os.close(fd)
            shutil.rmtree(self.profile, ignore_errors=True)
            raise
        finally:
            log.close()
            os.close(to_child)
            os.close(from_child)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- the protocol -----------------------------------------------------------

    def call(self, method, params=None, session=None, timeout=None):
        """Send one command; its ``result``, or ChromiumError."""
        self._next_id += 1
        message = {"id": self._next_id, "method": method,
                   "params": params or {}}
        if session:
            message["sessionId"] = session
        self._send(message)
        deadline = time.monotonic() + (timeout or self.timeout)
        while True:
            reply = self._receive(deadline, method)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise ChromiumError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self._note(reply)

    def wait_event(self, method, session=None, timeout=None):
        """The first event ``method`` (of ``session``) not yet taken."""
        deadline = time.monotonic() + (timeout or self.timeout)
        while True:
            for i, event in enumerate(self._events):
                if event.get("method") == method and \
                        (session is None or event.get("sessionId") == session):
                    return self._events.pop(i)
            self._note(self._receive(deadline, method))

    def _send(self, message):
        data = json.dumps(message).encode() + b"\0"
        while data:
            _, ready, _ = select.select([], [self._out], [], self.timeout)
            if not ready:
                raise ChromiumError("Chromium does not read its pipe")
            data = data[os.write(self._out, data):]

    def _receive(self, deadline, waiting_for):
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            ready = select.select([self._in], [], [], max(0, left))[0]
            if not ready:
                raise ChromiumError(f"no answer to {waiting_for} in time")
            chunk = os.read(self._in, 1 << 20)
            if not chunk:
                raise ChromiumError(f"Chromium exited ({self._stderr()})")
            self._buffer += chunk
        raw, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(raw)

    def _note(self, event):
        """Keep an event; record it in `problems` if it reports one."""
        method, params = event.get("method"), event.get("params", {})
        if method == "Runtime.exceptionThrown":
            details = params.get("exceptionDetails", {})
            self.problems.append(
                details.get("exception", {}).get("description")
                or details.get("text", "exception"))
        elif method == "Runtime.consoleAPICalled" and \
                params.get("type") in ("error", "assert"):
            self.problems.append(" ".join(
                str(a.get("value", a.get("description", "")))
                for a in params.get("args", [])))
        elif method == "Log.entryAdded" and \
                params.get("entry", {}).get("level") == "error":
            self.problems.append(params["entry"].get("text", "log error"))
        if method:
            self._events.append(event)

    def _stderr(self):
        try:
            with open(os.path.join(self.profile, "stderr.log"), "rb") as f:
                return f.read()[-600:].decode(errors="replace").strip()
        except OSError:
            return "no output"

    # -- pages --------------------------------------------------------------------

    def open(self, url, width=1280, height=900):
        """A new tab of ``width`` x ``height`` CSS pixels showing ``url``,
        loaded, with Runtime and Log reporting to `problems`."""
        target = self.call("Target.createTarget", {"url": "about:blank"})
        session = self.call("Target.attachToTarget",
                            {"targetId": target["targetId"],
                             "flatten": True})["sessionId"]
        page = Page(self, session)
        for domain in ("Runtime", "Log", "Page"):
            self.call(f"{domain}.enable", session=session)
        self.call("Emulation.setDeviceMetricsOverride",
                  {"width": width, "height": height,
                   "deviceScaleFactor": 1, "mobile": False}, session)
        self.call("Page.navigate", {"url": url}, session)
        self.wait_event("Page.loadEventFired", session)
        return page

    def close(self):
        """End Chromium (asked, then killed), reap it, remove the profile."""
        process = getattr(self, "process", None)
        if process is not None and process.poll() is None:
            try:
                self.call("Browser.close", timeout=5)
            except (ChromiumError, OSError, ValueError):
                pass
            try:
                process.wait(5)
            except subprocess.TimeoutExpired:
                pass
        if process is not None and process.poll() is None:
            try:
                os.killpg(process.pid, 9)
            except ProcessLookupError:
                pass
            process.wait(10)
        if process is not None:
            try:   # its helpers share its session: leave none behind
                os.killpg(process.pid, 9)
            except (ProcessLookupError, PermissionError):
                pass
        for fd in (self._in, self._out):
            try:
                os.close(fd)
            except OSError:
                pass
        self._in = self._out = -1
        shutil.rmtree(self.profile, ignore_errors=True)


class Page:
    """One tab: evaluate script in it, take its screenshot."""

    def __init__(self, browser, session):
        self.browser, self.session = browser, session

    def evaluate(self, expression):
        """The value of ``expression`` (JSON-able); ChromiumError if it
        throws."""
        result = self.browser.call(
            "Runtime.evaluate", {"expression": expression,
                                 "returnByValue": True,
                                 "awaitPromise": True}, self.session)
        if "exceptionDetails" in result:
            details = result["exceptionDetails"]
            raise ChromiumError(
                details.get("exception", {}).get("description")
                or details.get("text", "the expression threw"))
        return result["result"].get("value")

    def screenshot(self, full_page=False):
        """PNG bytes of the viewport, or of the whole page."""
        params = {"format": "png"}
        if full_page:
            size = self.browser.call("Page.getLayoutMetrics",
                                     session=self.session)["cssContentSize"]
            params.update(captureBeyondViewport=True, clip={
                "x": 0, "y": 0, "width": size["width"],
                "height": size["height"], "scale": 1})
        data = self.browser.call("Page.captureScreenshot", params,
                                 self.session)["data"]
        return base64.b64decode(data)


def _as_fds_3_and_4(read_end, write_end):
    """In the child: its end of our pipes as fds 3 (read) and 4 (write)."""
    read_end, write_end = os.dup(read_end), os.dup(write_end)
    os.dup2(read_end, 3)
    os.dup2(write_end, 4)
