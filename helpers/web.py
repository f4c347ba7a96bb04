"""SWIFT's Web-UI (界面训练): started, reached, its training page read, mapped to `swift sft` flags, stopped.

`swift web-ui` runs in the background and is reached directly or through a hosted notebook's proxy; its
training page is read from the app's own Gradio config over HTTP, without a browser."""

from __future__ import annotations

import atexit
import json
import os
import time
import urllib.error
import urllib.request
from pathlib import Path

from helpers import launching, paths
from helpers.errors import CourseError


def http_status(url: str, timeout: float = 3.0) -> int | None:
    """The HTTP status ``url`` answers with, or None when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as reply:  # noqa: S310 (localhost only)
            return reply.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except (urllib.error.URLError, OSError):
        return None


BACKGROUND_NICE = 19  # the Web-UI's priority while it loads unwatched: the lowest


def set_session_priority(pid: int, nice: int) -> None:
    """Set the priority of the session that ``pid`` leads, where Linux's autogroup scheduler is on.

    That scheduler (``/proc/sys/kernel/sched_autogroup_enabled`` = 1) shares the CPU between sessions
    first, and each launch is a session of its own, so the processes' own nice values count only inside
    it; the session's is ``/proc/<pid>/autogroup``, which its owner may raise and lower again between 0 and
    19. Measured on 2 cores: a 28 s generation took 44 s beside a Web-UI loading at normal priority, 28 s
    with it at 19. Where the file is missing or refused, nothing changes.
    """
    try:
        Path(f"/proc/{pid}/autogroup").write_text(str(nice))
    except OSError:
        pass


GRADIO_GAVE_UP = "When localhost is not accessible"  # what Gradio raises when its check of its own page fails


class WebUI:
    """``swift web-ui`` on localhost in the background: ``start()``, ``wait()`` for HTTP 200, ``stop()``."""

    def __init__(self, port: int | None = None, lang: str = "en", host: str = "127.0.0.1", proxied: bool = False,
                 extra=()):  # fmt: skip
        self.host, self.port, self.lang = host, port or launching.free_port(), lang
        self.proxied = proxied  # served through a hosted notebook's port proxy: Gradio's links carry its path
        self.extra = [str(a) for a in extra]  # any other flag of `swift web-ui`, passed on as written
        self.launch = None
        self.pids: set[int] = set()

    @classmethod
    def typed(cls, command: str, proxied: bool = False) -> WebUI:
        """The Web-UI a typed ``swift web-ui --lang en --server_name 127.0.0.1 --server_port 7860`` starts:
        those three flags as given (SWIFT's defaults where left out: zh, 127.0.0.1, 7860, as in
        ``swift/arguments/webui_args.py``), every other flag passed on."""
        from helpers import swiftcli

        _, subcommand, args = swiftcli.parse_swift_text(command)
        if subcommand != "web-ui":
            raise CourseError(
                f"{command.splitlines()[0]!r} is not a swift web-ui command; write it as "
                "'swift web-ui --lang en --server_name 127.0.0.1 --server_port 7860'."
            )
        known, extra, i = {"--lang": "zh", "--server_name": "127.0.0.1", "--server_port": "7860"}, [], 0
        while i < len(args):
            if args[i] in known and i + 1 < len(args):
                known[args[i]], i = args[i + 1], i + 2
            else:
                extra.append(args[i])
                i += 1
        return cls(port=int(known["--server_port"]), lang=known["--lang"], host=known["--server_name"],
                   proxied=proxied, extra=extra)  # fmt: skip

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/"

    @property
    def proxy_path(self) -> str:
        """The page's path behind a hosted notebook's port proxy (jupyter-server-proxy): the server's base
        path (JupyterHub's ``JUPYTERHUB_SERVICE_PREFIX``, e.g. ``/user/ann/``), then ``proxy/<port>/``."""
        prefix = os.environ.get("JUPYTERHUB_SERVICE_PREFIX", "/")
        return f"/{prefix.strip('/')}/proxy/{self.port}/".replace("//", "/")

    def start(self) -> WebUI:
        argv = [
            "swift",
            "web-ui",
            "--lang",
            self.lang,
            "--server_name",
            self.host,
            "--server_port",
            self.port,
            *self.extra,
        ]
        # no usage statistics sent; BROWSER=true: gradio's "open a browser tab" does nothing
        env = {"GRADIO_ANALYTICS_ENABLED": "False", "BROWSER": "true"}
        if self.proxied:  # Gradio reads it (gradio/blocks.py), not SWIFT: the page's links then work behind the proxy
            env["GRADIO_ROOT_PATH"] = self.proxy_path
        self.launch = launching.Launch(argv, env=env, label="swift web-ui", cwd=paths.run_dir("webui"))
        self.launch.start()
        # until someone waits for it, it loads on the CPU time the lesson's training leaves idle
        set_session_priority(self.launch.proc.pid, BACKGROUND_NICE)
        atexit.register(self.stop)  # never outlive the kernel, even if a later cell fails
        return self

    def _remember_processes(self) -> None:
        import psutil

        try:
            root = psutil.Process(self.launch.proc.pid)
            self.pids |= {root.pid} | {p.pid for p in root.children(recursive=True)}
        except psutil.NoSuchProcess:
            pass

    def wait(self, timeout: float = 120) -> tuple[int, float]:
        """Poll until the page answers HTTP 200; returns (status, seconds). Stops everything on failure.
        Waited for, it runs at normal priority: at the lowest, other busy processes could starve it."""
        start, started_again = time.monotonic(), False
        while time.monotonic() - start < timeout:
            set_session_priority(self.launch.proc.pid, 0)
            self._remember_processes()
            self.launch.drain(False, "")
            if self.launch.proc.poll() is not None:
                tail = "\n    ".join(self.launch.lines[-12:])
                self.stop()
                if GRADIO_GAVE_UP in tail and not started_again:
                    # Gradio asks its own page once it serves, and gives up after one 3-second timeout
                    # (gradio/networking.py, url_ok): a busy machine, not a broken set-up
                    print("swift web-ui: Gradio's check of its own page timed out (a busy machine); starting it once more.")
                    started_again = True
                    self.start()
                    continue
                raise launching.LaunchError(
                    f"swift web-ui exited with code {self.launch.proc.returncode}:\n    {tail}"
                )
            status = http_status(self.url)
            if status == 200:
                return status, time.monotonic() - start
            time.sleep(1)
        self.stop()
        raise launching.LaunchTimeout(
            f"swift web-ui did not answer {self.url} within {timeout:g} s; it was stopped."
        )

    def stop(self) -> int:
        """Stop the Web-UI and everything it started; returns how many of its processes are still alive (0)."""
        import psutil

        if self.launch is None or self.launch.proc is None:
            return 0
        self._remember_processes()
        launching.kill_tree(self.launch.proc.pid)
        self.launch.proc.wait(timeout=30)
        alive = []
        for pid in self.pids:
            try:
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    alive.append(pid)
            except psutil.NoSuchProcess:
                pass
        return len(alive)

    def __enter__(self) -> WebUI:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


TRAINING_TAB = "llm_train"  # SWIFT's elem_id of its training tab, "LLM PT/SFT" (zh: "LLM预训练/微调")


def training_page(url: str, timeout: float = 30) -> dict:
    """SWIFT's training page as the Web-UI running at ``url`` describes it, read over HTTP without a browser.

    Gradio serves the app's whole description as JSON at ``<url>/config`` (gradio/routes.py, ``get_config``):
    every component with its ``props`` (label, elem_id, initial value; a value of None is left out) and a
    ``layout`` tree of component ids that nests them in tabs. Returned: ``{"title": the page's title, "tab":
    the training tab's label, "fields": {elem_id: {"label": ..., "value": ...}}}`` for the components inside
    that tab (SWIFT's elem_id ``llm_train``) that hold a value (Gradio marks rows, tabs and buttons
    ``skip_api``). SWIFT gives each field the id of the CLI argument it sets and a label ending in the flag,
    e.g. ``"Train type(--tuner_type)"``. The values are those the page is served with; when a browser opens
    it, its load event (swift/ui/app.py, ``app.load``) fills in the model's template and system prompt."""
    address = url.rstrip("/") + "/config"
    try:
        with urllib.request.urlopen(address, timeout=timeout) as reply:
            config = json.loads(reply.read())
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise CourseError(f"{address} gave no Gradio config ({exc}); is the Web-UI running?") from None
    config = config if isinstance(config, dict) else {}
    components = {c.get("id"): c for c in config.get("components", []) if isinstance(c, dict)}
    tab = next((c for c in components.values() if c.get("props", {}).get("elem_id") == TRAINING_TAB), None)

    def under(node: dict, inside: bool) -> list:  # the ids in the training tab, in the page's order
        inside = inside or (tab is not None and node.get("id") == tab["id"])
        below = [i for child in node.get("children", []) for i in under(child, inside)]
        return [node.get("id")] * inside + below

    fields: dict = {}
    for component in map(components.get, under(config.get("layout", {}), False)):
        props = component.get("props", {}) if component else {}
        if props.get("elem_id") and not component.get("skip_api"):
            fields.setdefault(props["elem_id"], {"label": props.get("label"), "value": props.get("value")})
    if "tuner_type" not in fields:
        raise CourseError(
            f"{url} is not SWIFT's Web-UI: its config has no training tab with a tuner_type field."
        )
    return {"title": config.get("title"), "tab": tab["props"].get("label"), "fields": fields}


def webui_fields(flags) -> list[dict]:
    """The Web-UI training page's field for each of ``flags`` (names without ``--``), as SWIFT labels it
    in English and Chinese: read from the ``locale_dict`` tables in swift/ui/llm_train/*.py (parsed, not
    imported: importing would load gradio), where each field's id is the CLI argument it sets. Flags the
    page has no field for are left out."""
    import ast
    import importlib.util

    folder = Path(importlib.util.find_spec("swift").origin).parent / "ui" / "llm_train"
    labels: dict = {}
    for source in sorted(folder.glob("*.py")):
        for node in ast.walk(ast.parse(source.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == [
                "locale_dict"
            ]:
                try:
                    table = ast.literal_eval(node.value)
                except ValueError:  # a table built by code, not written out: not a page of fields
                    continue
                for key, entry in table.items():
                    if isinstance(entry, dict) and isinstance(entry.get("label"), dict):
                        labels.setdefault(key, entry["label"])
    return [
        {"flag": f"--{f}", "field (en)": labels[f]["en"], "字段 (zh)": labels[f]["zh"]}
        for f in flags
        if f in labels
    ]
