"""The launcher: failures name their rank, hangs are stopped, launches don't collide, nothing survives."""

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import launched
import pytest

from conftest import processes_mentioning
from helpers import launching, paths, swiftcli

SCRIPT = textwrap.dedent(
    """
    import os, sys, time
    import torch.distributed as dist
    from launched import exit_together, save_result  # copied beside this script

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    print(f"ready {rank}", flush=True)
    save_result({"rank": rank, "world": dist.get_world_size(), "port": os.environ["MASTER_PORT"]})
    mode = sys.argv[1] if len(sys.argv) > 1 else "ok"
    if mode == "raise" and rank == 1:
        raise ValueError("rank one is unhappy")
    if mode == "hang":
        time.sleep(600)
    exit_together()
    """
)


@pytest.fixture
def script(tmp_path, build):
    path = tmp_path / "job_under_test.py"
    path.write_text(SCRIPT)
    launched.beside(path)
    yield path
    time.sleep(0.5)
    survivors = processes_mentioning(str(path))
    for proc in survivors:  # the next tests must not run beside them
        launching.kill_tree(proc.pid)
    assert survivors == [], "a launched process survived the test"


def test_success_returns_each_rank_result_and_shows_the_command(script, capsys):
    result = launching.torchrun(script, nproc=2, timeout=60)
    assert result.returncode == 0
    assert [r["rank"] for r in result.results] == [0, 1]
    assert {r["world"] for r in result.results} == {2}
    out = capsys.readouterr().out
    assert "$ OMP_WAIT_POLICY=PASSIVE TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE='[rank${rank}]:' torchrun --nproc-per-node 2" in out
    assert str(script) in out.splitlines()[0]
    assert "[rank0]:ready 0" in out and "[rank1]:ready 1" in out


def test_a_failing_rank_becomes_an_exception_with_its_code_and_traceback(script):
    start, timeout = time.monotonic(), 120
    with pytest.raises(launching.LaunchError) as info:
        launching.torchrun(script, "raise", nproc=2, timeout=timeout, show=False)
    err = info.value
    assert not isinstance(err, launching.LaunchTimeout)
    assert (err.rank, err.exitcode) == (1, 1)
    assert "rank 1 failed with exit code 1" in str(err)
    assert "ValueError: rank one is unhappy" in str(err)
    assert any(line.startswith("Traceback") for line in err.tail)
    assert time.monotonic() - start < timeout / 4  # reported when the rank fails, long before the timeout


def test_a_hang_past_the_timeout_is_stopped(script):
    # 20 s: on a loaded 2-core machine, torchrun and two ranks importing torch can take 10 s to be ready
    start = time.monotonic()
    with pytest.raises(launching.LaunchTimeout, match="did not finish within 20 s") as info:
        launching.torchrun(script, "hang", nproc=2, timeout=20, show=False)
    assert time.monotonic() - start < 2 * 20  # stopped at the timeout, not left to run
    assert "ready" in str(info.value)


def test_two_launches_at_once_get_different_ports(script):
    results, errors = [], []

    def go():
        try:
            results.append(launching.torchrun(script, nproc=2, timeout=90, show=False))
        except Exception as exc:  # collected and reported below
            errors.append(exc)

    threads = [threading.Thread(target=go) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    ports = {r.results[0]["port"] for r in results}
    assert len(ports) == 2


def ignore_sigint():
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.mark.parametrize("parent", ["default", "SIGINT ignored"])
def test_an_interrupt_stops_the_whole_tree(script, tmp_path, parent):
    """Ctrl-C stops the launch, also when the parent started us with SIGINT ignored (``nohup cmd &``)."""
    driver = tmp_path / "driver.py"
    driver.write_text(
        "from helpers import launching\n"
        "try:\n"
        f"    launching.torchrun({str(script)!r}, 'hang', nproc=2, timeout=300)\n"
        "except KeyboardInterrupt:\n"
        "    print('driver saw the interrupt', flush=True)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, str(driver)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        preexec_fn=ignore_sigint if parent == "SIGINT ignored" else None,
    )
    seen = []
    for line in proc.stdout:  # wait until both ranks are up (no deadline needed: the launch has one)
        seen.append(line)
        if sum("ready" in s for s in seen) >= 2:
            break
    assert sum("ready" in s for s in seen) >= 2, "".join(seen)
    assert len(processes_mentioning(str(script))) >= 3  # torchrun and two workers
    proc.send_signal(signal.SIGINT)  # what Ctrl-C in a terminal, or Jupyter's stop button, sends
    rest = proc.communicate(timeout=60)[0]
    assert "Interrupted: stopped" in rest and "driver saw the interrupt" in rest


def test_a_single_process_failure_quotes_its_traceback(build):
    launch = launching.Launch([sys.executable, "-c", "import sys; print('working'); sys.exit('bad input')"])
    with pytest.raises(
        launching.LaunchError, match=r"failed with exit code 1\. The end of its output:"
    ) as info:
        launching.run(launch, show=False)
    assert "bad input" in str(info.value)


def test_swift_with_several_processes_sets_torchrun_options(build, monkeypatch):
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")  # as a terminal may have it: then the launch adds nothing
    launch = swiftcli.prepare_swift("sft", "--model", "x", nproc=2)
    command = launch.command
    assert command.startswith("NPROC_PER_NODE=2 MASTER_PORT=")
    assert "PET_TEE=3" in command and command.endswith("swift sft --model x")
    assert swiftcli.prepare_swift("infer", "--model", "x").command == "swift infer --model x"



TEARDOWN = textwrap.dedent(
    """
    import os, sys
    import torch.distributed as dist
    from helpers.launching import TEARDOWN_ABORT

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    dist.barrier()
    if rank == 0 and sys.argv[1] == "finished":
        print("all work done", flush=True)
    dist.barrier()
    if rank == 1:  # what a gloo rank sometimes does after its work, while the interpreter shuts down
        print(TEARDOWN_ABORT, file=sys.stderr, flush=True)
        os.abort()
    """
)


@pytest.mark.parametrize("printed", ["finished", "unfinished"])
def test_an_abort_while_exiting_after_the_work_is_a_note_not_an_error(tmp_path, build, capsys, printed):
    path = tmp_path / "teardown_job.py"
    path.write_text(TEARDOWN)
    launch = launching.prepare_torchrun(path, printed, nproc=2, timeout=60)
    launch.finished = "all work done"  # what prepare_swift sets to SWIFT's last log line
    if printed == "unfinished":  # the abort is an error unless the job proved it had finished
        with pytest.raises(launching.LaunchError) as info:
            launching.run(launch, show=False)
        assert info.value.rank == 1 and info.value.exitcode == -signal.SIGABRT
    else:
        result = launching.run(launch, show=False)[0]
        assert result.returncode != 0 and "rank 1 aborted while exiting" in result.note
        assert "Note: rank 1 aborted while exiting" in capsys.readouterr().out
    time.sleep(0.5)
    assert processes_mentioning(str(path)) == []


def test_swift_launches_name_the_line_that_proves_the_work_finished():
    assert swiftcli.prepare_swift("sft", "--help").finished == "End time of running main"
    # LOG_LEVEL=WARNING hides that INFO line: training then proves itself with rank 0's summary
    quiet = swiftcli.prepare_swift("sft", "--help", nproc=2, env={"LOG_LEVEL": "WARNING"})
    assert quiet.finished == "'train_runtime'"
    assert (
        swiftcli.prepare_swift("export", env={"LOG_LEVEL": "WARNING"}).finished == "End time of running main"
    )
    assert launching.prepare_torchrun("x.py").finished is None


def test_the_stop_button_stops_a_launch_and_the_next_cell_runs(script):
    """JupyterLab's stop button is a kernel interrupt: the launch stops, nothing survives, the kernel lives."""
    import asyncio

    import nbformat
    from nbclient import NotebookClient
    from nbformat.v4 import new_code_cell, new_notebook

    nb = new_notebook(cells=[
        new_code_cell(f"from helpers import launching\nlaunching.torchrun({str(script)!r}, 'hang', nproc=2, timeout=300)"),
        new_code_cell("print('next cell ran', 6 * 7)"),
    ])  # fmt: skip
    client = NotebookClient(nb, kernel_name="python3", timeout=600, allow_errors=True)
    finished = {}

    def execute():
        client.execute()
        finished["at"] = time.monotonic()

    worker = threading.Thread(target=execute)
    worker.start()
    deadline = time.monotonic() + 240
    while len(processes_mentioning(str(script))) < 3 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert len(processes_mentioning(str(script))) >= 3, "the launch never started"
    time.sleep(1)  # both ranks are past their imports
    pressed = time.monotonic()
    asyncio.run(client.km.interrupt_kernel())  # what the stop button asks the kernel manager to do
    while processes_mentioning(str(script)) and time.monotonic() - pressed < 60:
        time.sleep(0.2)
    stopped_after = time.monotonic() - pressed
    worker.join(timeout=120)
    assert not worker.is_alive()
    assert processes_mentioning(str(script)) == []
    assert stopped_after < 10, (
        f"the launch took {stopped_after:.1f} s to stop"
    )  # about 3.5 s (TERM, then KILL)
    launch, after = nb.cells
    errors = [o for o in launch.outputs if o.output_type == "error"]
    assert [e.ename for e in errors] == ["KeyboardInterrupt"]
    assert "Interrupted: stopped" in "".join(
        o.get("text", "") for o in launch.outputs if o.output_type == "stream"
    )
    # the stream may arrive in several chunks ("next cell ran", " 42\n"): compare the text, not the chunks
    assert (
        "".join(o.get("text", "") for o in after.outputs if o.output_type == "stream") == "next cell ran 42\n"
    )
    nbformat.validate(nb)


def test_swift_goes_through_torchrun_for_one_process_when_asked(build, monkeypatch):
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")  # as a terminal may have it: then the launch adds nothing
    """DeepSpeed needs torchrun's RANK and WORLD_SIZE even on one GPU: NPROC_PER_NODE=1 makes SWIFT use it."""
    one = swiftcli.prepare_swift("sft", "--deepspeed", "zero2", nproc=1, torchrun=True).command
    assert one.startswith("NPROC_PER_NODE=1 MASTER_PORT=") and one.endswith("swift sft --deepspeed zero2")
    assert "NPROC_PER_NODE" not in swiftcli.prepare_swift("sft", nproc=1).command


def test_a_prefix_and_an_address_put_torchrun_on_another_node(build, monkeypatch):
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    launch = launching.prepare_torchrun(
        "job.py", nproc=1, nnodes=2, node_rank=1, master_addr="10.213.0.1", master_port=29400,
        prefix=["ip", "netns", "exec", "dpc1-node1"], env={"GLOO_SOCKET_IFNAME": "eth0"},
    )  # fmt: skip
    assert launch.argv[:5] == ["ip", "netns", "exec", "dpc1-node1", "torchrun"]
    assert "--master-addr 10.213.0.1 --master-port 29400" in launch.command
    assert (
        launch.command.startswith("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE=")
        and "GLOO_SOCKET_IFNAME=eth0" in launch.command
    )


@pytest.mark.parametrize(
    "line, folded",
    [
        ("[WARNING:swift] Loading model from 'x' with trust_remote_code=True.", True),
        ("Map (num_proc=1): 128 examples [00:00, 451.69 examples/s]       ", True),
        ("Map (num_proc=1): 192 examples [00:00, 813.27 examples/s]       [rank0]:", True),
        ("Loading weights: 100%|██████████| 272/272 [00:00<00:00, 32992.59it/s]", True),
        ("", True),
        ("{'loss': 3.46707225, 'grad_norm': 2.61, 'global_step/max_steps': '1/40'}", False),
        ("Traceback (most recent call last):", False),
        ("[ERROR:swift] something failed", False),
        (
            "[W1201 07:39:21.89 socket.cpp:207] [c10d] The hostname of the client socket cannot be retrieved. err=-3",
            True,
        ),
    ],
)
def test_library_chatter_is_folded_and_what_teaches_is_shown(line, folded):
    assert bool(launching._FOLDED.search(line)) == folded


def test_folded_lines_are_counted_and_kept_in_the_launch_output_file(build, capsys):
    code = "print('[INFO:swift] chatter'); print(''); print('the result: 42')"
    launch = launching.Launch([sys.executable, "-c", code], label="fold test", timeout=60)
    [result] = launching.run(launch)
    shown = capsys.readouterr().out.split("\n", 1)[1]  # after the command line
    assert "the result: 42" in shown and "chatter" not in shown
    assert (
        "(2 lines of library logs, progress bars and blank lines not shown; the whole output is in " in shown
    )
    assert launch.output_file.read_text().splitlines() == ["[INFO:swift] chatter", "", "the result: 42"]
    assert result.returncode == 0 and launch.output_file.name.startswith("fold-test-")


def test_a_shown_swift_command_is_run_exactly_as_written(build, monkeypatch):
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")  # as a terminal may have it: then the launch adds nothing
    """The text a notebook prints is the command that runs: its environment, subcommand and flags."""
    from helpers import paths

    text = swiftcli.swift_text(
        "sft",
        [
            "--model",
            str(paths.ROOT / "build/models/m"),
            "--model_author",
            "并行训练营",
            "Parallel Training Camp",
        ],
        {"LOG_LEVEL": "WARNING", "NPROC_PER_NODE": 2},
    )
    assert text.splitlines()[0] == "LOG_LEVEL=WARNING NPROC_PER_NODE=2 swift sft \\"
    assert "--model build/models/m" in text and str(paths.ROOT) not in text  # typed at the repository root
    env, sub, args = swiftcli.parse_swift_text(text)
    assert (env, sub) == ({"LOG_LEVEL": "WARNING", "NPROC_PER_NODE": "2"}, "sft")
    assert args == ["--model", "build/models/m", "--model_author", "并行训练营", "Parallel Training Camp"]
    ran = []
    monkeypatch.setattr(launching, "run", lambda launch, show=True: ran.append(launch) or [None])
    swiftcli.swift_shell(text, timeout=5)
    [launch] = ran
    assert launch.argv == ["swift", "sft", *args] and launch.cwd == paths.ROOT
    assert launch.extra_env["LOG_LEVEL"] == "WARNING" and launch.extra_env["NPROC_PER_NODE"] == "2"
    assert launch.shown_as.startswith("▶ swift sft: the command above, with MASTER_PORT=")
    with pytest.raises(launching.CourseError, match="is not a swift command"):
        swiftcli.parse_swift_text("python train.py --x 1")


def test_launched_processes_wait_without_spinning_unless_the_environment_says_otherwise(build, monkeypatch):
    """OMP_WAIT_POLICY=PASSIVE reaches every launched process, set by the launch, not by importing a module."""
    imported = subprocess.run(
        [sys.executable, "-c", "import os, helpers.sft, helpers.web, helpers.launching; print(os.environ.get('OMP_WAIT_POLICY'))"],
        capture_output=True, text=True, env={k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"},
        cwd=paths.ROOT, check=True,
    )  # fmt: skip
    assert imported.stdout.strip() == "None", "importing a helpers module must not change the environment"
    code = "import os; print('policy', os.environ.get('OMP_WAIT_POLICY'))"
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    launch = launching.Launch([sys.executable, "-c", code], timeout=60)
    assert launch.command.startswith("OMP_WAIT_POLICY=PASSIVE ")  # the printed command is the one that runs
    [result] = launching.run(launch, show=False)
    assert "policy PASSIVE" in result.output
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    launch = launching.Launch([sys.executable, "-c", code], timeout=60)
    assert not launch.command.startswith("OMP_WAIT_POLICY")  # inherited, as in a terminal
    [result] = launching.run(launch, show=False)
    assert "policy ACTIVE" in result.output


def test_swifts_step_lines_are_shown_as_short_lines_every_fifth_of_the_run(build, capsys):
    """100 step dicts become 7 short lines (steps 1, 20, 40, 60, 80, 100, and none twice); every line is
    still in the output file, and the fold note counts the rest."""
    steps = [
        f"{{'loss': {1 + 1 / k:.8f}, 'grad_norm': 1.2, 'learning_rate': 0.0007, 'token_acc': 0.75, "
        f"'global_step/max_steps': '{k}/100', 'elapsed_time': '{k}s', 'remaining_time': '{100 - k}s'}}"
        for k in range(1, 101)
    ]
    code = "import sys\nfor line in sys.stdin.read().splitlines(): print('[rank0]:' + line)\nprint('done')"
    script = build / "steps.py"
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text(code.replace("sys.stdin.read().splitlines()", repr(steps)))
    launch = launching.Launch([sys.executable, str(script)], label="steps", timeout=60)
    launching.run(launch)
    shown = capsys.readouterr().out.splitlines()[1:]
    step_lines = [line for line in shown if "step " in line and "/100" in line]
    assert [line.split(":")[1].strip().split()[1] for line in step_lines] == [
        "1/100", "20/100", "40/100", "60/100", "80/100", "100/100"]  # fmt: skip
    assert step_lines[1] == "[rank0]:step 20/100: loss 1.0500, token_acc 0.750, 20s elapsed, 80s left"
    assert "and 94 of SWIFT's step lines, not shown" in shown[-1] and "done" in shown
    assert len(launch.output_file.read_text().splitlines()) == 101


@pytest.mark.parametrize("total", [1, 3, 8, 100])
def test_a_short_run_shows_its_first_and_last_step(total):
    entry = "{{'loss': 1.5, 'global_step/max_steps': '{k}/{n}'}}"
    shown = [k for k in range(1, total + 1) if launching.step_line(entry.format(k=k, n=total)) is not None]
    assert shown[0] == 1 and shown[-1] == total and len(shown) <= 6
    assert launching.step_line(entry.format(k=total, n=total)) == f"step {total}/{total}: loss 1.5000"
