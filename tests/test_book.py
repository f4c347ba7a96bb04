"""`make book`: the site of the executed course in both languages, opened in headless Chromium."""

import functools
import http.server
import re
import threading
import urllib.request
from urllib.parse import quote, urldefrag, urljoin, urlparse

import pytest

from conftest import need_chromium
from course import book, browser, runner
from helpers import paths


@pytest.fixture(scope="module", autouse=True)
def chromium():
    need_chromium()

LESSONS = [nb.stem for nb in runner.course_notebooks()]
SHOTS = paths.build_dir() / "book-shots"  # one screenshot per lesson and edition, kept for a person to look at
# MathJax typesets a page's formulas after it loads: the crawl waits for it before reading the page
MATHJAX_DONE = "window.MathJax && MathJax.startup ? MathJax.startup.promise.then(() => true) : false"

PAGE_FACTS = """(() => ({
  h1: [...document.querySelectorAll('main h1, article h1')].map(h => h.textContent.trim()),
  links: [...document.querySelectorAll('a[href]')].map(a => a.href),
  ids: [...document.querySelectorAll('[id]')].map(e => e.id),
  images: [...document.images].map(i => ({src: i.src, ok: i.complete && i.naturalWidth > 0})),
  language: document.documentElement.lang,
  switch: [...document.querySelectorAll('a.language-switch')].map(a => a.href),
  prev: document.querySelector('a.left-prev') ? document.querySelector('a.left-prev').href : null,
  next: document.querySelector('a.right-next') ? document.querySelector('a.right-next').href : null,
  math: document.querySelectorAll('.math').length,
  typeset: document.querySelectorAll('mjx-container').length,
  text: document.body.innerText,
}))()"""


class Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The book built into a temporary build/ and served on 127.0.0.1 (as a host would serve it)."""
    build = tmp_path_factory.mktemp("build")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("COURSE_BUILD_DIR", str(build))
        index = book.build()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(index.parent)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()


@pytest.fixture(scope="module")
def pages(site):
    """Every page reachable by links from both editions' start pages, crawled in Chromium with every request
    that leaves 127.0.0.1 blocked: url -> facts."""
    chrome = browser.Browser(local_only=True)
    SHOTS.mkdir(parents=True, exist_ok=True)
    try:
        seen, queue = {}, [site + "en/index.html", site + "zh-CN/index.html"]
        while queue:
            url = queue.pop(0)
            if url in seen:
                continue
            loaded = chrome.open(url)
            mathjax = chrome.evaluate(MATHJAX_DONE)
            facts = chrome.evaluate(PAGE_FACTS)
            seen[url] = {**loaded, **facts, "mathjax": mathjax}
            edition, _, page = url.removeprefix(site).partition("/")
            if page.removesuffix(".html") in LESSONS:  # one picture per lesson, for a person to look over
                chrome.screenshot(SHOTS / f"{edition}-{page.removesuffix('.html')}.png")
            for link in facts["links"]:
                target = urldefrag(link).url
                if target.startswith(site) and target.endswith(".html") and target not in seen:
                    queue.append(target)
        # the search page, asked for a word every edition teaches
        found = {}
        for edition, word in (("en", "Reducer"), ("zh-CN", "梯度")):
            chrome.open(f"{site}{edition}/search.html?q={quote(word)}")
            found[edition] = chrome.evaluate(
                "new Promise(r => { const t0 = Date.now(); (function wait() {"
                " const n = document.querySelectorAll('#search-results li').length;"
                " if (n || Date.now() - t0 > 15000) r(n); else setTimeout(wait, 200); })(); })")  # fmt: skip
        seen["search"] = found
        # the block holds: a request outside fails, one to the site still loads
        seen["outside"] = chrome.evaluate(
            "Promise.all(['http://example.com/', location.href].map(u => fetch(u, {mode: 'no-cors'})"
            ".then(() => 'loaded', () => 'blocked')))")  # fmt: skip
    finally:
        chrome.close()
    return seen


def lesson_url(site, edition, stem):
    return f"{site}{edition}/{stem}.html"


def test_every_page_renders_with_its_images_and_no_error(site, pages):
    html = {url: facts for url, facts in pages.items() if url not in ("search", "outside")}
    for edition in ("en", "zh-CN"):
        for stem in [*LESSONS, "index", "report", "cheatsheet"]:
            assert lesson_url(site, edition, stem) in html, f"{edition}/{stem}.html is not linked from the site"
    for url, facts in html.items():
        assert facts["status"] == 200, url
        assert not facts["failed"], f"{url}: did not load {facts['failed']}"
        outside = [u for u in facts["requests"] if not u.startswith((site, "data:", "blob:"))]
        assert not outside, f"{url}: asked for something outside the site: {outside}"
        assert not facts["errors"], f"{url}: script errors {facts['errors']}"
        assert all(image["ok"] for image in facts["images"]), f"{url}: broken images"
        if "/_" not in url and not url.endswith(("genindex.html", "search.html")):
            assert facts["h1"], f"{url} has no title"
    for edition in ("en", "zh-CN"):
        lesson = html[lesson_url(site, edition, "04_inside_ddp")]
        assert len(lesson["images"]) >= 5, "04's plots are in its page"


def test_every_internal_link_resolves(site, pages):
    html = {url: facts for url, facts in pages.items() if url not in ("search", "outside")}
    for url, facts in html.items():
        for link in facts["links"]:
            target, fragment = urldefrag(link)
            if not target.startswith(site):
                continue
            if target.endswith(".html"):
                assert target in html, f"{url} links to {link}, which is not there"
                if fragment:
                    assert fragment in html[target]["ids"], f"{url} links to {link}: no such anchor"
            else:
                assert urlparse(target).path.startswith(("/en/", "/zh-CN/")), f"{url}: stray link {link}"


def test_the_crawl_reaches_nothing_outside_the_site(pages):
    assert pages["outside"] == ["blocked", "loaded"]


def test_formulas_are_typeset_by_the_sites_own_mathjax(site, pages):
    """MathJax comes with the site (nothing from a CDN) and turns every formula into rendered math."""
    with_math = 0
    for edition in ("en", "zh-CN"):
        for stem in LESSONS:
            facts = pages[lesson_url(site, edition, stem)]
            if facts["math"]:
                with_math += 1
                assert facts["mathjax"] and facts["typeset"] >= facts["math"], f"{edition}/{stem}: formulas not typeset"
                assert not re.search(r"\\\(|\\\[|\$\$", facts["text"]), f"{edition}/{stem}: raw TeX shows"
    assert with_math >= 4, "01's and 10's formulas are on their pages, in both editions"
    assert len(list(SHOTS.glob("*.png"))) == 2 * len(LESSONS)


def test_every_table_a_notebook_prints_shows_as_a_table(site, pages):
    """report.table's markdown outputs become HTML tables, not a paragraph of pipes, in both editions."""
    for edition in ("en", "zh-CN"):
        for stem in LESSONS:
            url = lesson_url(site, edition, stem)
            source = urllib.request.urlopen(url).read().decode()
            assert "|---|" not in pages[url]["text"], f"{url}: a table shows as raw pipes"
            if '"text/markdown"' in (paths.NOTEBOOKS / f"{stem}.ipynb").read_text():  # it prints a table
                assert "<table" in source, f"{url}: no table"


def test_solutions_are_collapsed_on_every_lesson_page(site, pages):
    """A solution is in the page, a click away, but a reader who does not open it never sees it."""
    for edition in ("en", "zh-CN"):
        for stem in LESSONS:
            url = lesson_url(site, edition, stem)
            source = urllib.request.urlopen(url).read().decode()
            shown = pages[url]["text"]
            assert re.search(r"\w+_solution\b", source), f"{url}: no solution on the page"
            assert not re.search(r"\w+_solution\b", shown), f"{url}: a solution shows open"


def test_the_language_switch_lands_on_the_same_lesson(site, pages):
    for stem in [*LESSONS, "index", "report", "cheatsheet"]:
        en, zh = lesson_url(site, "en", stem), lesson_url(site, "zh-CN", stem)
        assert pages[en]["switch"] == [zh] and pages[zh]["switch"] == [en], stem
        assert pages[en]["language"] == "en" and pages[zh]["language"] == "zh-CN"
    # the Chinese page is the translation, not a copy: its title is in Chinese
    for stem in LESSONS:
        title = pages[lesson_url(site, "zh-CN", stem)]["h1"][0]
        assert re.search(r"[\u4e00-\u9fff]", title.split("（")[0]), title


def test_previous_and_next_follow_the_course_order(site, pages):
    for edition in ("en", "zh-CN"):
        order = ["index", *LESSONS, "report", "cheatsheet"]
        for before, page, after in zip(order, order[1:], order[2:], strict=False):
            facts = pages[lesson_url(site, edition, page)]
            assert facts["prev"] == lesson_url(site, edition, before), page
            assert facts["next"] == lesson_url(site, edition, after), page


def test_the_syllabus_gives_each_lessons_budget_and_measured_time(site, pages):
    for edition in ("en", "zh-CN"):
        text = pages[lesson_url(site, edition, "index")]["text"]
        for notebook in runner.course_notebooks():
            run = book.recorded_run(notebook)
            assert f"{run.budget_seconds:.0f} s" in text
            if run.status == "passed":
                assert f"{run.seconds:.0f} s (cpu)" in text, notebook.name
        report = pages[lesson_url(site, edition, "report")]["text"]
        assert "09_swift_lora_self_cognition" in report and "metric" in report


def test_the_cheat_sheet_is_a_page_of_both_editions_with_the_whole_glossary(site, pages):
    from helpers import glossary

    for edition in ("en", "zh-CN"):
        text = pages[lesson_url(site, edition, "cheatsheet")]["text"]
        assert "torchrun --nproc-per-node 2 train.py" in text and "dist.init_process_group" in text, edition
        assert all(t.english_forms[0] in text and t.chinese_forms[0] in text for t in glossary.terms()), edition


def test_search_finds_a_word_in_each_language(pages):
    assert pages["search"]["en"] > 0
    assert pages["search"]["zh-CN"] > 0


def test_links_out_of_the_site_are_only_to_the_web(site, pages):
    for url, facts in pages.items():
        if url in ("search", "outside"):
            continue
        for link in facts["links"]:
            assert link.startswith((site, "http://", "https://", "mailto:", "javascript:")), f"{url}: {link}"
    assert urljoin(site, "en/") == site + "en/"



def test_the_browser_reads_a_built_page_and_photographs_it(site, tmp_path):
    """course.browser beyond the crawl: a page's HTML once its scripts are done, and a 1280x900 PNG of it."""
    import struct

    shot, chrome = tmp_path / "page.png", browser.Browser()
    try:
        assert chrome.open(site + "en/index.html")["status"] == 200
        chrome.settle()
        html = chrome.html()
        chrome.screenshot(shot)
    finally:
        chrome.close()
    assert "<h1" in html and "Syllabus" in html and "language-switch" in html
    head = shot.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and struct.unpack(">II", head[16:24]) == (1280, 900)
    assert shot.stat().st_size > 20_000, "a blank page compresses to almost nothing"
