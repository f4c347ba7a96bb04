"""SWIFT's Web-UI: notebook 09 starts it for the learner, maps its fields to flags and reads its training page
from the app's own Gradio config (web.training_page). Here: the real `swift web-ui` starts, serves SWIFT's
training page, and stops leaving none of its processes; the field table and the page reader on their own."""

import base64
import http.server
import io
import json
import os
import subprocess
import sys
import threading

import pytest
from PIL import Image

from conftest import need_chromium
from course import translation, webui_shot
from helpers import launching, web
from helpers.errors import CourseError


def test_the_field_table_is_swifts_own_labels():
    """notebook 09 maps the page's fields to flags from SWIFT's locale tables, parsed from its source."""
    from swift.ui.llm_train.lora import LoRA
    from swift.ui.llm_train.self_cog import SelfCog

    rows = {
        r["flag"]: r for r in web.webui_fields(["lora_rank", "model_author", "use_cpu", "no_such_flag"])
    }
    assert rows["--lora_rank"]["field (en)"] == LoRA.locale_dict["lora_rank"]["label"]["en"]
    assert rows["--model_author"]["字段 (zh)"] == SelfCog.locale_dict["model_author"]["label"]["zh"]
    assert set(rows) == {"--lora_rank", "--model_author"}  # no field for --use_cpu, nor for a made-up flag


# A Gradio app built like SWIFT's Web-UI (its tab's and fields' elem_ids, labels ending in the flag), served
# by the installed Gradio: the real /config endpoint, in seconds. In a process of its own: importing swift.ui
# (the test above) patches Gradio's components in this one (swift/ui/base.py).
APP = """
import sys
import gradio as gr

with gr.Blocks(title="SWIFT WebUI") as app, gr.Tabs():
    if sys.argv[2] == "swift":
        with gr.Tab("LLM PT/SFT", elem_id="llm_train"):
            gr.Dropdown(["Qwen/Qwen2.5-7B-Instruct"], value="Qwen/Qwen2.5-7B-Instruct",
                        label="Model id or path(--model)", elem_id="model")
            gr.Textbox(label="System(--system)", elem_id="system")
            gr.Dropdown(["lora", "full"], value="lora", label="Train type(--tuner_type)",
                        elem_id="tuner_type")
            gr.Button("Begin", elem_id="submit")
    with gr.Tab("LLM Inference", elem_id="llm_infer"):
        gr.Dropdown(["Qwen/Qwen3-8B"], value="Qwen/Qwen3-8B", label="Model id or path(--model)",
                    elem_id="model")
app.launch(server_name="127.0.0.1", server_port=int(sys.argv[1]), prevent_thread_lock=True, quiet=True)
print(app.local_url, flush=True)
sys.stdin.read()  # serves until the test closes its stdin
"""


@pytest.fixture
def gradio_app():
    """serve(kind): the address of APP ("swift": with SWIFT's training tab; "other": without), running."""
    started = []

    def serve(kind: str) -> str:
        env = {**os.environ, "GRADIO_ANALYTICS_ENABLED": "False"}
        app = subprocess.Popen([sys.executable, "-c", APP, str(launching.free_port()), kind], env=env,
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # fmt: skip
        started.append(app)
        url = app.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:"), f"the Gradio app did not start (exit code {app.poll()})"
        return url

    yield serve
    for app in started:
        app.stdin.close()
        try:
            app.wait(timeout=30)
        except subprocess.TimeoutExpired:
            app.kill()
            app.wait()


def test_training_page_reads_swifts_fields_from_the_gradio_config(gradio_app):
    page = web.training_page(gradio_app("swift"))
    assert page["title"] == "SWIFT WebUI" and page["tab"] == "LLM PT/SFT"
    fields = page["fields"]
    assert list(fields) == ["model", "system", "tuner_type"]  # in the page's order; the button is no field
    assert fields["tuner_type"] == {"label": "Train type(--tuner_type)", "value": "lora"}
    assert fields["model"]["value"] == "Qwen/Qwen2.5-7B-Instruct"  # the training tab's, not the other tab's
    assert fields["system"]["value"] is None  # an empty field: Gradio leaves its value out of the config


def test_training_page_says_when_the_page_is_not_swifts(gradio_app):
    url = gradio_app("other")
    with pytest.raises(CourseError, match=r"is not SWIFT's Web-UI: its config has no training tab"):
        web.training_page(url)


class Stub(http.server.BaseHTTPRequestHandler):
    body = b"<html>not Gradio</html>"

    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args):
        pass


def test_training_page_says_when_nothing_serves_a_gradio_config():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Stub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with pytest.raises(CourseError, match=r"/config gave no Gradio config"):
            web.training_page(f"http://127.0.0.1:{server.server_address[1]}/")
    finally:
        server.shutdown()
        server.server_close()
    with pytest.raises(CourseError, match=r"gave no Gradio config .*is the Web-UI running\?"):
        web.training_page(f"http://127.0.0.1:{launching.free_port()}", timeout=2)


def test_swift_web_ui_serves_swifts_training_page_and_stops_leaving_no_process():
    """09, section 8: the Web-UI the lesson starts answers HTTP 200 with SWIFT's training page, whose Model
    field holds the hub's Qwen2.5-7B-Instruct (as 09's text says), a browser sees the training tab (the
    picture `make webui-shot` keeps in 09), it loaded at the lowest priority until waited for, and stop() leaves none."""
    need_chromium()
    webui = web.WebUI().start()
    try:
        loading = session_nice(webui.launch.proc.pid)  # unwatched, it loads at the lowest priority
        status, _ = webui.wait(timeout=240)
        waited = session_nice(webui.launch.proc.pid)  # waited for, at normal priority
        page = web.training_page(webui.url)
        picture, text = webui_shot.photograph(webui)
    finally:
        left = webui.stop()
    assert "LLM PT/SFT" in text and "Train type" in text, text[:300]
    assert_a_page_picture(picture)
    assert status == 200 and left == 0
    assert (loading, waited) in ((19, 0), (None, None)), (loading, waited)  # None: a kernel without autogroup
    assert web.http_status(webui.url, timeout=2) is None
    fields = page["fields"]
    assert page["tab"] == "LLM PT/SFT" and "--tuner_type" in fields["tuner_type"]["label"]
    assert fields["model"]["value"] == "Qwen/Qwen2.5-7B-Instruct"


def assert_a_page_picture(picture: bytes) -> None:
    """A JPEG of the browser's whole 1280x900 viewport that shows a page, not a blank or one-colour screen."""
    image = Image.open(io.BytesIO(picture))
    assert image.format == "JPEG" and image.size == (1280, 900)
    colours = image.convert("L").getcolors(256)
    assert colours is not None and len(colours) > 64, "the picture is nearly one colour"


def test_09_keeps_the_web_uis_picture_and_both_editions_show_it():
    for notebook in (webui_shot.NOTEBOOK, translation.edition_path(webui_shot.NOTEBOOK)):
        [cell] = [c for c in json.loads(notebook.read_text())["cells"] if c.get("id") == webui_shot.CELL]
        assert webui_shot.LINK in "".join(cell["source"]), notebook.name
        assert_a_page_picture(base64.b64decode(cell["attachments"][webui_shot.NAME]["image/jpeg"]))



def session_nice(pid: int) -> int | None:
    """The nice value of the session ``pid`` leads under Linux's autogroup scheduler; None without it."""
    try:
        with open(f"/proc/{pid}/autogroup") as f:
            return int(f.read().split()[-1])
    except FileNotFoundError:
        return None


def test_a_sessions_priority_goes_down_and_back_up():
    """09's Web-UI loads beside training at nice 19, the session's priority under Linux's autogroup
    scheduler (a process's own nice does not count across sessions), and gets 0 back when waited for."""
    proc = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        seen = []
        for nice in (web.BACKGROUND_NICE, 0):
            web.set_session_priority(proc.pid, nice)
            seen.append(session_nice(proc.pid))
        assert seen in ([19, 0], [None, None]), seen
    finally:
        proc.kill()
        proc.wait()
    web.set_session_priority(proc.pid, 0)  # a process already gone: nothing to do, and no error
