"""`make runsheet`: WORKSHOP.md as the instructor prints it, a PDF of landscape A4 pages made by the headless
Chromium of course/browser.py from the Markdown rendered with markdown-it (both in the learner's lock)."""

import re
import sys
import tempfile
from pathlib import Path

from course.browser import Browser
from helpers import paths

RUNSHEET = paths.ROOT / "WORKSHOP.md"
PAGES = 2  # the run sheet's most pages: what an instructor prints the night before and carries
# small print, as a printed timetable is: 8.5 pt text, tables across the page's width
CSS = """
@page { size: A4 landscape; margin: 9mm 10mm; }
body { font: 8.5pt/1.25 "DejaVu Sans", Arial, sans-serif; margin: 0; }
h1 { font-size: 13pt; margin: 0 0 3px; } h2 { font-size: 10.5pt; margin: 6px 0 3px; }
p { margin: 3px 0; } code { font-size: 8pt; }
table { border-collapse: collapse; width: 100%; }
th, td { border: 0.5pt solid #888; padding: 1px 3px; vertical-align: top; text-align: left; }
tr { break-inside: avoid; }
"""


def html(markdown: str, title: str) -> str:
    """The Markdown as one HTML page with the print style."""
    from markdown_it import MarkdownIt

    body = MarkdownIt("commonmark").enable("table").render(markdown)
    return f'<!doctype html><html><head><meta charset="utf-8"><title>{title}</title><style>{CSS}</style></head><body>{body}</body></html>'


def page_count(pdf: bytes) -> int:
    """The pages of a PDF Chromium wrote: its page objects (``/Type /Page``, not ``/Pages``)."""
    return len(re.findall(rb"/Type\s*/Page(?![a-zA-Z])", pdf))


def print_pdf(source: Path, target: Path) -> int:
    """``source`` (Markdown) printed into ``target``; returns its number of pages."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="course-print-") as folder:
        page = Path(folder) / f"{source.stem}.html"
        page.write_text(html(source.read_text(encoding="utf-8"), source.stem), encoding="utf-8")
        browser = Browser(local_only=True)
        try:
            browser.open(page.as_uri())
            target.write_bytes(browser.pdf())
        finally:
            browser.close()
    return page_count(target.read_bytes())


def main() -> int:
    from course.browser import chromium

    if chromium() is None:
        print("error: make runsheet prints through a headless Chromium and none is installed; on Debian or Ubuntu: "
              "apt-get install -y chromium.", file=sys.stderr)  # fmt: skip
        return 2
    target = paths.build_dir() / "print" / "WORKSHOP.pdf"
    pages = print_pdf(RUNSHEET, target)
    print(f"{target}: {pages} landscape A4 page(s)")
    if pages > PAGES:
        print(f"error: the run sheet takes {pages} pages; shorten WORKSHOP.md to {PAGES}.", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
