"""`make webui-shot`: photograph SWIFT's Web-UI as 09's command starts it, into 09's section 8.

The picture is kept in the notebook (a markdown cell's attachment, so the Chinese edition and the site
carry it too); tests/test_webui.py takes a fresh one from the real Web-UI and checks what it shows."""

import base64
import json
import sys

from course import browser, translation
from helpers import paths, web

NOTEBOOK = paths.NOTEBOOKS / "09_swift_lora_self_cognition.ipynb"
CELL, NAME = "c27a", "webui.jpg"  # the markdown cell after the Web-UI's address, and the attachment's name
LINK = f"![SWIFT's Web-UI, training tab](attachment:{NAME})"
QUALITY = 70  # JPEG: a 1280x900 page in about 100 KB


def photograph(webui: web.WebUI, timeout: float = 240) -> tuple[bytes, str]:
    """The page of a started Web-UI once its scripts have built it: (JPEG bytes, its visible text)."""
    status, _ = webui.wait(timeout=timeout)
    if status != 200:
        raise RuntimeError(f"the Web-UI at {webui.url} answered {status}, not 200")
    chrome = browser.Browser(timeout=120)
    try:
        chrome.open(webui.url)
        chrome.settle(120)
        return chrome.screenshot(quality=QUALITY), chrome.evaluate("document.body.innerText")
    finally:
        chrome.close()


def attach(picture: bytes) -> None:
    """Put ``picture`` into 09's cell as its attachment (the cell's text links it), then rebuild the zh edition."""
    nb = json.loads(NOTEBOOK.read_text())
    [cell] = [c for c in nb["cells"] if c.get("id") == CELL]
    if LINK not in "".join(cell["source"]):
        raise RuntimeError(f"09's cell {CELL} does not link {LINK}: add that line to its text first")
    cell["attachments"] = {NAME: {"image/jpeg": base64.b64encode(picture).decode()}}
    NOTEBOOK.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
    translation.build(NOTEBOOK)


def main() -> int:
    webui = web.WebUI(lang="en").start()  # as 09 types it: swift web-ui --lang en ...
    try:
        picture, text = photograph(webui)
    finally:
        webui.stop()
    if "LLM PT/SFT" not in text:
        print(f"webui-shot: the page does not show SWIFT's training tab; it reads: {text[:200]!r}", file=sys.stderr)
        return 1
    attach(picture)
    print(f"webui-shot: {len(picture) // 1024} KB into {paths.relative(NOTEBOOK)}, cell {CELL}, and its zh edition")
    return 0


if __name__ == "__main__":
    sys.exit(main())
