"""A headless Chromium driven over the DevTools protocol: open a page, wait in real time until it is built,
read it, photograph it, and see what failed to load (the site's test, tests/test_book.py)."""

import base64
import json
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import websocket

# Headless, and quiet on a machine without network. No --virtual-time-budget: its virtual clock stops
# while any request is pending, so a page that keeps a connection open (Gradio's) can wait forever.
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]  # fmt: skip


def chromium() -> str | None:
    """The headless browser, or None where none is installed."""
    return next((found for name in ("chromium", "chromium-browser", "google-chrome") if (found := shutil.which(name))), None)


# local_only: every request that leaves 127.0.0.1 goes to a proxy that is not there (port 9, discard), so
# it fails; Chromium never proxies loopback, so the pages served here still load
LOCAL_ONLY = ["--proxy-server=http://127.0.0.1:9"]


class Browser:
    def __init__(self, timeout: float = 60, local_only: bool = False):
        binary = chromium()
        if binary is None:
            raise RuntimeError("no Chromium is installed; on Debian or Ubuntu: apt-get install -y chromium.")
        self.profile = tempfile.mkdtemp(prefix="course-chromium-")
        self.process = subprocess.Popen(
            [binary, *FLAGS, *(LOCAL_ONLY if local_only else []), f"--user-data-dir={self.profile}",
             "--remote-debugging-port=0", "--window-size=1280,900", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        active = Path(self.profile) / "DevToolsActivePort"
        deadline = time.monotonic() + timeout
        while not (active.exists() and len(active.read_text().split()) == 2):
            if time.monotonic() > deadline or self.process.poll() is not None:
                self.close()
                raise RuntimeError("Chromium did not open its DevTools port")
            time.sleep(0.1)
        port, path = active.read_text().split()
        self.socket = websocket.create_connection(f"ws://127.0.0.1:{port}{path}", timeout=timeout)
        self.timeout, self.next_id, self.events = timeout, 0, []
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        for domain in ("Page", "Network", "Runtime"):
            self.call(f"{domain}.enable", session=True)
        self.call("Emulation.setDeviceMetricsOverride", session=True, width=1280, height=900, deviceScaleFactor=1,
                  mobile=False)  # fmt: skip

    def call(self, method: str, session: bool = False, **params):
        self.next_id += 1
        message = {"id": self.next_id, "method": method, "params": params}
        if session:
            message["sessionId"] = self.session
        self.socket.send(json.dumps(message))
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            reply = json.loads(self.socket.recv())
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)
        raise TimeoutError(method)

    def open(self, url: str) -> dict:
        """Load ``url``; returns {status, requests: [every url it asked for], failed: [urls that did not load],
        errors: [uncaught exceptions]}."""
        self.events.clear()
        before = self.evaluate("location.href")
        self.call("Page.navigate", session=True, url=url)
        deadline = time.monotonic() + self.timeout
        while True:  # the new document (its address changed, or is the one asked for) has loaded
            state, href = self.evaluate("[document.readyState, location.href]")
            if state == "complete" and (href == url or href != before):
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"{url} did not finish loading")
            time.sleep(0.05)
        self.evaluate("new Promise(r => setTimeout(r, 200))")  # late requests and scripts settle
        status = next((e["params"]["response"]["status"] for e in self.events
                       if e.get("method") == "Network.responseReceived" and e["params"]["type"] == "Document"), None)  # fmt: skip
        requests = {e["params"]["requestId"]: e["params"]["request"]["url"] for e in self.events
                    if e.get("method") == "Network.requestWillBeSent"}  # fmt: skip
        failed = [requests.get(e["params"]["requestId"], "?") for e in self.events
                  if e.get("method") == "Network.loadingFailed"]  # fmt: skip
        failed += [e["params"]["response"]["url"] for e in self.events
                   if e.get("method") == "Network.responseReceived" and e["params"]["response"]["status"] >= 400]  # fmt: skip
        errors = [e["params"]["exceptionDetails"].get("text", "") for e in self.events
                  if e.get("method") == "Runtime.exceptionThrown"]  # fmt: skip
        return {"status": status, "requests": list(requests.values()), "failed": failed, "errors": errors}

    def settle(self, seconds: float = 60) -> None:
        """Wait until the page's text stops changing for a second (scripts that build the page are done)."""
        deadline, last, same = time.monotonic() + seconds, None, 0
        while time.monotonic() < deadline and same < 4:
            now = self.evaluate("document.body ? document.body.innerText.length : -1")
            same = same + 1 if now == last and now > 0 else 0
            last = now
            time.sleep(0.25)

    def html(self) -> str:
        return self.evaluate("document.documentElement.outerHTML")

    def screenshot(self, path=None, quality: int | None = None) -> bytes:
        """The viewport (1280x900) as PNG bytes, or JPEG at ``quality`` (0-100); written to ``path`` if given."""
        params = {"format": "png"} if quality is None else {"format": "jpeg", "quality": quality}
        data = base64.b64decode(self.call("Page.captureScreenshot", session=True, **params)["data"])
        if path is not None:
            Path(path).write_bytes(data)
        return data

    def pdf(self) -> bytes:
        """The page printed as a PDF, with the page size and margins of its own CSS ``@page`` rule."""
        return base64.b64decode(self.call("Page.printToPDF", session=True, preferCSSPageSize=True,
                                          printBackground=True)["data"])  # fmt: skip

    def evaluate(self, expression: str):
        result = self.call("Runtime.evaluate", session=True, expression=expression, awaitPromise=True,
                           returnByValue=True)  # fmt: skip
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression[:60]}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def close(self) -> None:
        if getattr(self, "socket", None):
            self.socket.close()
        self.process.kill()
        self.process.wait()
        shutil.rmtree(self.profile, ignore_errors=True)  # Chromium may still be writing into it
