"""The runner and papermill: a run and its report, bad parameters, a failing notebook, Ctrl-C.

The whole course on smoke is executed once, by nbval (`make notebooks`), not here a second time: the
runner's own work (order, report, failures, interrupts) is checked on small notebooks made here.
"""

import json
import os
import subprocess
import sys
import time

import nbformat
import papermill as pm
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from course import reap, runner
from helpers import paths

NOTEBOOKS = runner.course_notebooks()


def parameters_of(notebook):
    nb = nbformat.read(notebook, as_version=4)
    cell = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
    return cell.source


def run_with(notebook, tmp_path, **parameters):
    with pytest.raises(pm.PapermillExecutionError) as info:
        pm.execute_notebook(
            str(notebook),
            str(tmp_path / notebook.name),
            parameters=parameters,
            cwd=str(paths.NOTEBOOKS),
            kernel_name="python3",
            progress_bar=False,
        )
    return info.value


BAD = [(nb, {"PROFILE": "quantum"}, ["PROFILE = 'quantum'", "'smoke'"]) for nb in NOTEBOOKS]
FIRST = NOTEBOOKS[0] if NOTEBOOKS else None
BAD += [
    (nb, {"NPROC": 0}, ["NPROC = 0", "at least 1"])
    for nb in NOTEBOOKS
    if "NPROC" in parameters_of(nb) and nb.name.startswith("00")
]
BAD += [
    (nb, {"DATASETS": "hub"}, ["DATASETS = 'hub'", "only the gpu profile", "'course'"])
    for nb in NOTEBOOKS
    if nb.name.startswith("09")
]
BAD += [
    (nb, {"MODEL": "/no/such/model"}, ["MODEL = '/no/such/model'", "None"])
    for nb in NOTEBOOKS
    if "MODEL" in parameters_of(nb) and nb.name.startswith("08")
]


@pytest.mark.parametrize("notebook, parameters, words", BAD, ids=lambda v: getattr(v, "stem", None))
def test_bad_parameters_stop_at_the_resolve_cell_with_one_sentence(notebook, parameters, words, tmp_path):
    error = run_with(notebook, tmp_path, **parameters)
    assert error.ename == "CourseError"
    assert "profiles.resolve(" in error.source
    assert len(error.traceback) == 1, "no stack of frames for a learner's mistake"
    message = str(error.evalue)
    assert "\n" not in message and message.endswith(".")
    for word in words:
        assert word in message


def mini_notebook(path, fails: bool):
    nb = new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    params = new_code_cell('PROFILE = "auto"')
    params.metadata["tags"] = ["parameters"]
    nb.cells = [
        new_markdown_cell("# A tiny lesson"),
        params,
        new_code_cell("from helpers import profiles, report\nprofile = profiles.resolve(PROFILE)"),
        new_code_cell('report.record("answer", 42)'),
    ]
    if fails:
        nb.cells.append(new_code_cell("values = [1, 2]\ntotal = values[5]"))
    nbformat.write(nb, path)


def test_a_run_executes_in_course_order_and_reports(tmp_path, monkeypatch, capfd):
    lessons = tmp_path / "notebooks"
    lessons.mkdir()
    names = ["01_first", "02_second", "10_tenth"]
    for name in reversed(names):  # written in reverse: the order must come from the numbers
        mini_notebook(lessons / f"{name}.ipynb", fails=False)
    monkeypatch.setattr(paths, "NOTEBOOKS", lessons)
    build = tmp_path / "build"
    monkeypatch.setenv("COURSE_BUILD_DIR", str(build))  # run_course sets it; restored after the test
    (tmp_path / "run").mkdir()
    monkeypatch.setattr(runner, "socket_bases", lambda: [tmp_path / "run"])  # the kernels' socket folders
    assert runner.run_course("smoke", build=build, progress=False) == 0
    report = json.loads((build / "report.json").read_text())
    assert report["profile"] == "smoke"
    assert [n["name"] for n in report["notebooks"]] == names
    for entry in report["notebooks"]:
        assert entry["status"] == "passed", entry
        assert entry["seconds"] > 0 and entry["peak_memory_mb"] > 0
        assert [m["name"] for m in entry["metrics"]] == ["answer"]
        assert (build / "executed" / f"{entry['name']}.ipynb").is_file()
    out, err = capfd.readouterr()  # the kernels' own stderr too
    assert "without encryption" not in err  # ipc transport: no TCP warning from every kernel
    sockets = tmp_path / "run" / f"ddp-course-{os.getuid()}"
    assert sockets.is_dir() and not list(sockets.iterdir())  # the kernels' folders were there, and are gone
    assert not (build / "kernels").exists()  # never under the checkout, whose path may be long
    assert f"Report: {build / 'report.md'}" in out
    assert "Outputs: " in out and "make prune KEEP=2" in out
    assert "| answer | 42 |" in (build / "report.md").read_text()


def test_a_failing_notebook_fails_the_run_and_is_named_with_its_cell(tmp_path, monkeypatch, capsys):
    lessons = tmp_path / "notebooks"
    lessons.mkdir()
    mini_notebook(lessons / "01_passes.ipynb", fails=False)
    mini_notebook(lessons / "02_fails.ipynb", fails=True)
    monkeypatch.setattr(paths, "NOTEBOOKS", lessons)
    monkeypatch.setenv("COURSE_BUILD_DIR", str(tmp_path / "build"))
    status = runner.run_course("smoke", build=tmp_path / "build", progress=False)
    assert status == 1
    report = json.loads((tmp_path / "build" / "report.json").read_text())
    first, second = report["notebooks"]
    assert first["status"] == "passed" and first["metrics"][0]["value"] == 42
    assert second["status"] == "failed"
    assert second["error"]["error"] == "IndexError"
    assert second["error"]["line"] == "values = [1, 2]"
    assert second["error"]["cell"] == 5  # execution count: parameters, injected parameters, 3 more
    md = (tmp_path / "build" / "report.md").read_text()
    assert "**Failed** in cell 5" in md and "IndexError" in md
    assert "FAILED: 02_fails, cell 5" in capsys.readouterr().err


def lesson_with(path, code: str) -> None:
    """A tiny lesson (:func:`mini_notebook`) whose last cell runs ``code``."""
    mini_notebook(path, fails=False)
    nb = nbformat.read(path, as_version=4)
    nb.cells.append(new_code_cell(code))
    nbformat.write(nb, path)


def detached_sleeper(marker: str) -> str:
    """Code for a cell that starts a process in a session of its own (as 09 starts the Web-UI), sleeping for
    ten minutes, with ``marker`` on its command line."""
    return (
        "import subprocess, sys\n"
        f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)', {marker!r}], start_new_session=True)\n"
    )


def runner_command(lessons, build) -> list[str]:
    """`make run PROFILE=smoke` over the notebooks in ``lessons``, into ``build``, as a command to start."""
    driver = (
        "import sys; from pathlib import Path; from helpers import paths; from course import runner\n"
        f"paths.NOTEBOOKS = Path({str(lessons)!r})\n"
        f"sys.exit(runner.main(['run', '--profile', 'smoke', '--build', {str(build)!r}, '--no-progress']))\n"
    )
    return [sys.executable, "-c", driver]


HANG = """
import time
import torch.distributed as dist
dist.init_process_group("gloo")
print("ready", dist.get_rank(), flush=True)
time.sleep(600)
"""


def test_ctrl_c_stops_the_run_says_where_and_reports_it(tmp_path):
    """Ctrl-C in the terminal during a launch: everything stops, the run names the cell and exits 130.

    The runner is started with SIGINT ignored, as ``nohup make run &`` would leave it: it must not matter.
    """
    import os
    import signal

    import psutil

    from conftest import processes_mentioning

    script = tmp_path / "hangs_forever.py"
    script.write_text(HANG)
    lessons = tmp_path / "notebooks"
    lessons.mkdir()
    mini_notebook(lessons / "01_passes.ipynb", fails=False)
    lesson_with(lessons / "02_hangs.ipynb", f"from helpers import launching\nlaunching.torchrun({str(script)!r}, nproc=2)")
    mini_notebook(lessons / "03_never_reached.ipynb", fails=False)
    build = tmp_path / "build"

    def like_nohup():  # its own process group, as a terminal's foreground job; SIGINT ignored
        os.setsid()
        signal.signal(signal.SIGINT, signal.SIG_IGN)

    proc = subprocess.Popen(
        runner_command(lessons, build), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=like_nohup,
    )  # fmt: skip
    deadline = time.monotonic() + 240
    while len(processes_mentioning(str(script))) < 3 and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.5)
    everything = psutil.Process(proc.pid).children(recursive=True)
    assert len(processes_mentioning(str(script))) >= 3, "the launch never started"
    os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal sends to the foreground job
    pressed = time.monotonic()
    out, err = proc.communicate(timeout=120)
    stopped_after = time.monotonic() - pressed
    gone, alive = psutil.wait_procs(everything, timeout=5)
    assert alive == [], f"still running after Ctrl-C: {alive}"
    assert processes_mentioning(str(script)) == []
    assert proc.returncode == 130, out[-2000:] + err[-2000:]
    assert stopped_after < 30, f"took {stopped_after:.0f} s to stop"  # about 4 s here; 30 holds under load
    # code cells: parameters, injected parameters, resolve, record, then the launch
    assert "INTERRUPTED: 02_hangs, cell 5 (`from helpers import launching`)" in err, err[-1500:]
    report = json.loads((build / "report.json").read_text())
    assert [n["status"] for n in report["notebooks"]] == ["passed", "interrupted", "not run"]
    assert report["notebooks"][1]["error"]["cell"] == 5
    assert "**Interrupted** in cell 5" in (build / "report.md").read_text()



def test_sigterm_stops_the_run_and_what_a_cell_started_in_a_session_of_its_own(tmp_path):
    """`kill <runner>` (or a cancelled CI job) stops the run as Ctrl-C does, and with it a process a cell
    started in a session of its own, as 09 starts the Web-UI, which would outlive a dead kernel."""
    import os
    import signal

    from conftest import processes_mentioning

    marker = f"detached-{os.getpid()}-{time.monotonic_ns()}"
    lessons = tmp_path / "notebooks"
    lessons.mkdir()
    lesson_with(lessons / "01_starts_a_server.ipynb", detached_sleeper(marker) + "import time\ntime.sleep(600)")
    build = tmp_path / "build"
    proc = subprocess.Popen(runner_command(lessons, build), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 240
    while not processes_mentioning(marker) and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.5)
    assert processes_mentioning(marker), "the cell never started its process"
    proc.send_signal(signal.SIGTERM)  # to the runner alone, as `kill` sends it
    out, err = proc.communicate(timeout=120)
    deadline = time.monotonic() + 10
    while processes_mentioning(marker) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert processes_mentioning(marker) == [], "the cell's process outlived the run"
    assert proc.returncode == 130, out[-2000:] + err[-2000:]
    report = json.loads((build / "report.json").read_text())
    assert [n["status"] for n in report["notebooks"]] == ["interrupted"]


def test_a_process_a_passing_notebook_left_running_is_stopped_and_named(tmp_path):
    """A cell that starts a process in a session of its own and never stops it: the notebook passes, and the
    runner stops what is left and says what it was."""
    import os

    from conftest import processes_mentioning

    marker = f"left-behind-{os.getpid()}-{time.monotonic_ns()}"
    lessons = tmp_path / "notebooks"
    lessons.mkdir()
    lesson_with(lessons / "01_leaves_one.ipynb", detached_sleeper(marker))
    done = subprocess.run(runner_command(lessons, tmp_path / "build"), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "01_leaves_one.ipynb: 1 process(es) it left running were stopped: " in done.stdout
    assert marker in done.stdout
    assert processes_mentioning(marker) == []


def test_refresh_stores_outputs_and_the_runs_profile_time_and_memory(tmp_path, monkeypatch):
    """`make refresh` keeps what the notebook showed and how long it took (the site's syllabus shows it),
    and drops papermill's timestamps."""
    source = tmp_path / "01_tiny.ipynb"
    nb = new_notebook(cells=[new_markdown_cell("# Tiny"), new_code_cell("print('hello')")])
    nbformat.write(nb, source)

    def fake_execute(notebook, out, parameters, progress=False, timeout=None):
        executed = nbformat.read(notebook, as_version=4)
        executed.cells[1].outputs = [nbformat.v4.new_output("stream", name="stdout", text="hello\n")]
        executed.metadata["papermill"] = {"start_time": "2026-01-01T00:00:00"}
        out.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(executed, out)
        return runner.NotebookRun(name=notebook.stem, title="Tiny", status="passed", seconds=12.4, peak_memory_mb=456.2)

    monkeypatch.setenv("COURSE_BUILD_DIR", str(tmp_path / "build"))
    monkeypatch.setenv("COURSE_PROFILE", "cpu")
    monkeypatch.setattr(runner, "course_notebooks", lambda only=None: [source])
    monkeypatch.setattr(runner, "execute", fake_execute)
    assert runner.refresh() == 0
    stored = nbformat.read(source, as_version=4)
    assert stored.cells[1].outputs[0]["text"] == "hello\n"
    assert "papermill" not in stored.metadata
    assert stored.metadata["course_run"] == {"profile": "cpu", "seconds": 12, "peak_memory_mb": 456}


def tiny_notebook(path):
    nb = new_notebook(cells=[new_markdown_cell("# Tiny"), new_code_cell("print('hello')")])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)


def test_kernel_sockets_live_in_a_short_private_folder_of_their_own(tmp_path, monkeypatch):
    """A Unix socket's path holds 107 bytes: the kernels' folder is short, this user's alone, and fresh for
    each kernel; where no folder is short enough there is none (the kernel then talks over TCP)."""
    monkeypatch.setattr(runner, "socket_bases", lambda: [tmp_path])
    first, second = runner.socket_folder(), runner.socket_folder()
    assert first != second and first.parent == second.parent == tmp_path / f"ddp-course-{os.getuid()}"
    for folder in (first, first.parent):
        assert folder.stat().st_mode & 0o777 == 0o700
    assert len(os.fsencode(first / "kernel-65535")) <= runner.SOCKET_PATH_MAX
    deep = tmp_path / ("x" * runner.SOCKET_PATH_MAX)
    deep.mkdir()
    monkeypatch.setattr(runner, "socket_bases", lambda: [deep])
    assert runner.socket_folder() is None
    taken = tmp_path / "taken"  # a ddp-course-<uid> anyone may write in is passed over
    (taken / f"ddp-course-{os.getuid()}").mkdir(parents=True, mode=0o777)
    (taken / f"ddp-course-{os.getuid()}").chmod(0o777)
    monkeypatch.setattr(runner, "socket_bases", lambda: [taken, tmp_path])
    assert runner.socket_folder().parent == tmp_path / f"ddp-course-{os.getuid()}"


def test_where_no_socket_folder_is_short_enough_the_kernel_talks_over_encrypted_tcp(tmp_path, monkeypatch,
                                                                                     capfd):  # fmt: skip
    deep = tmp_path / ("x" * runner.SOCKET_PATH_MAX)
    deep.mkdir()
    monkeypatch.setattr(runner, "socket_bases", lambda: [deep])
    monkeypatch.setenv("COURSE_BUILD_DIR", str(tmp_path / "build"))
    tiny_notebook(tmp_path / "01_tiny.ipynb")
    run = runner.execute(tmp_path / "01_tiny.ipynb", tmp_path / "out.ipynb", {}, progress=False, cwd=tmp_path)
    assert run.status == "passed", run.error
    assert "without encryption" not in capfd.readouterr().err  # CurveZMQ: nothing in plain text on a port
    assert not list(deep.iterdir())


def test_a_kernel_that_cannot_connect_fails_its_notebook_and_leaves_no_context_to_hang_the_run(tmp_path):
    """A client whose sockets cannot connect (here: a socket path past 107 bytes) leaves a ZeroMQ context
    open; left to the garbage collector, its ``term()`` waits forever, in whatever the runner does next, and
    no signal ends it. The runner closes every client and context when a notebook ends."""
    tiny_notebook(tmp_path / "01_tiny.ipynb")
    deep = tmp_path / ("x" * runner.SOCKET_PATH_MAX)
    driver = (
        "import gc, sys; from pathlib import Path; from course import runner\n"
        f"deep = Path({str(deep)!r}); deep.mkdir()\n"
        "runner.socket_folder = lambda: deep\n"
        f"run = runner.execute(Path({str(tmp_path / '01_tiny.ipynb')!r}),\n"
        f"                     Path({str(tmp_path / 'out.ipynb')!r}), {{}}, progress=False,\n"
        f"                     cwd=Path({str(tmp_path)!r}))\n"
        "print(run.status, run.error['error'], run.error['message'], flush=True)\n"
        "gc.collect()\n"
        "print('collected', flush=True)\n"
    )
    env = {**os.environ, "COURSE_BUILD_DIR": str(tmp_path / "build")}
    try:  # well before the closing stage's own deadline would end it
        done = subprocess.run([sys.executable, "-c", driver], capture_output=True, text=True, env=env,
                              timeout=45)  # fmt: skip
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"the runner hung after a kernel that could not connect: {exc.stdout!r}")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "failed ZMQError File name too long" in done.stdout
    assert "collected" in done.stdout


def test_a_process_is_named_by_what_it_runs_whatever_the_interpreters_path(tmp_path):
    """A checkout at a long path gives its .venv's python a path that would fill the 120 characters a name
    has before the arguments that say what the process is."""
    interpreter = "/home/runner/work/" + "a-long-checkout/" * 8 + ".venv/bin/python"
    marker = f"named-{os.getpid()}-{time.monotonic_ns()}"
    argv = [interpreter, "-c", "import time; time.sleep(60)", marker]
    proc = subprocess.Popen(argv, executable=sys.executable)  # argv[0]: the long path, as /proc shows it
    try:
        import psutil

        deadline = time.monotonic() + 30  # until the child has exec'd: before that /proc shows the parent's line
        while marker not in psutil.Process(proc.pid).cmdline() and time.monotonic() < deadline:
            time.sleep(0.05)
        said = reap.described([psutil.Process(proc.pid)])
    finally:
        proc.kill()
        proc.wait()
    assert said == f"python -c import time; time.sleep(60) {marker}"


def test_a_stage_past_its_deadline_ends_with_one_sentence(capfd):
    sentence = "Closing 01_tiny.ipynb's kernel and what it left running did not end within 0.5 s."
    start = time.monotonic()
    with pytest.raises(runner.StageTimeout) as info:
        with runner.deadline(0.5, sentence):
            while True:
                time.sleep(0.05)
    assert time.monotonic() - start < 5
    assert str(info.value) == sentence
    assert capfd.readouterr().err == f"error: {sentence}\n"
    with runner.deadline(0.5, sentence):  # a stage that ends in time is left alone
        time.sleep(0.1)
    time.sleep(0.6)
    assert capfd.readouterr().err == ""


def test_a_stage_stuck_where_python_cannot_end_it_ends_the_run(tmp_path):
    """A stage stuck in a C call no signal interrupts (as ZeroMQ's ``term()``): past its deadline and the
    grace after it, the runner stops what it started and exits with status 124, having said why."""
    driver = (
        "import time; from course import runner\n"
        "with runner.deadline(0.5, 'Closing 01_tiny.ipynb took too long.', grace=0.5):\n"
        "    time.sleep(60)  # one C call: the StageTimeout cannot be raised inside it\n"
    )
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-c", driver], capture_output=True, text=True, timeout=30)
    assert done.returncode == 124, done.stderr[-2000:]
    assert done.stderr == "error: Closing 01_tiny.ipynb took too long.\n"
    assert time.monotonic() - start < 20
