"""A headless Chromium driven over the DevTools protocol, for the site's tests: open a page, wait for it to
load, evaluate JavaScript in it, and see what failed to load."""

import json
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import websocket

from helpers import finetune

# the course's headless flags, less the virtual-time budget a one-shot screenshot needs (a live page
# under it pauses its scripts, and DevTools calls wait forever)
LIVE_FLAGS = [flag for flag in finetune.CHROMIUM_FLAGS if not flag.startswith(("--virtual-time-budget", "--window-size"))]


class Browser:
    def __init__(self, timeout: float = 60):
        binary = finetune.chromium()
        if binary is None:
            raise RuntimeError("no Chromium")
        self.profile = tempfile.mkdtemp(prefix="course-chromium-")
        self.process = subprocess.Popen(
            [binary, *LIVE_FLAGS, f"--user-data-dir={self.profile}",
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
        """Load ``url``; returns {status, failed: [urls that did not load], errors: [uncaught exceptions]}."""
        self.events.clear()
        self.call("Page.navigate", session=True, url=url)
        deadline = time.monotonic() + self.timeout
        while self.evaluate("document.readyState + ' ' + location.href") != f"complete {url}":
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
        return {"status": status, "failed": failed, "errors": errors}

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
