"""`make hub`: two learners in headless Chromium log in, run notebook 00 side by side, each in their own files,
neither able to see the other's, and stopping the hub leaves no process. The parts without a hub on their own."""

import grp
import json
import os
import pwd
import shutil
import signal
import stat
import subprocess
import sys
import tarfile
import time
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest

from conftest import need_chromium
from course import browser, hub
from helpers import launching, paths
from helpers.errors import CourseError


def test_users_are_checked_one_sentence_each():
    assert hub.parse_users("alice, bob  carol2") == ["alice", "bob", "carol2"]
    with pytest.raises(CourseError, match=r"USERS is empty"):
        hub.parse_users("  ")
    with pytest.raises(CourseError, match=r"'Bob', which is not a valid user name"):
        hub.parse_users("alice Bob")
    with pytest.raises(CourseError, match=r"'root;id', which is not a valid user name"):
        hub.parse_users("root;id")
    with pytest.raises(CourseError, match=r"names alice more than once"):
        hub.parse_users("alice bob alice")
    with pytest.raises(CourseError, match=r"HUB_PORT = 'x' is not a port"):
        hub.check_port("x")
    with pytest.raises(CourseError, match=r"HUB_PREFIX = 'Course' is not a valid prefix"):
        hub.check_prefix("Course")


def test_every_core_is_handed_out_in_order_in_shares_that_differ_by_one_at_most():
    assert hub.core_shares([3, 2, 1, 0], 2) == [[0, 1], [2, 3]]
    assert hub.core_shares(list(range(8)), 3) == [[0, 1, 2], [3, 4, 5], [6, 7]]
    assert hub.core_shares([0, 1], 3) == [[0], [1], [0]]  # fewer cores than learners (HUB_CROWDED): one each, in turn
    for cores, learners in ((32, 16), (45, 20), (64, 20), (7, 2)):
        shares = hub.core_shares(list(range(cores)), learners)
        assert sorted(c for share in shares for c in share) == list(range(cores)), (cores, learners)  # each once
        assert max(map(len, shares)) - min(map(len, shares)) <= 1, (cores, learners)


def test_a_room_of_fewer_than_2_cores_or_8_gb_per_learner_is_refused_in_one_sentence():
    gb = 10**9
    assert hub.room_problem(20, 40, 150 * gb) is None and hub.room_problem(2, 64, 512 * gb) is None
    too_few_cores = hub.room_problem(20, 32, 256 * gb)
    assert too_few_cores == (
        "20 learners need 40 cores and 150 GB of memory (2 cores and 7.5 GB each), and this machine gives the hub 32 "
        "cores and 256 GB: name at most 16 learners in USERS, use a bigger machine, or set HUB_CROWDED=1 for a "
        "try-out in which notebooks run slower and may run out of memory."
    )
    assert "name at most 13 learners" in hub.room_problem(20, 64, 100 * gb)  # memory is the limit
    assert "name at most 0 learners" in hub.room_problem(1, 1, 4 * gb)
    assert hub.room_problem(20, 40, 149 * gb) is not None  # what make check asks of one machine, per learner


def test_passwords_are_kept_private_and_never_replaced(tmp_path):
    path = tmp_path / "hub" / "passwords"
    first, new = hub.passwords(path, ["alice", "bob"])
    assert new == ["alice", "bob"] and stat.S_IMODE(path.stat().st_mode) == 0o600
    again, new = hub.passwords(path, ["bob", "carol"])
    assert new == ["carol"] and again["bob"] == first["bob"] and again["alice"] == first["alice"]
    assert len({again["alice"], again["bob"], again["carol"]}) == 3


def test_a_learner_reads_the_shared_models_and_builds_what_is_missing_in_their_own(tmp_path, monkeypatch):
    from helpers import models

    shared, own = tmp_path / "shared", tmp_path / "own"
    monkeypatch.setenv("COURSE_MODELS_DIR", str(shared))
    models.tiny_llama()  # built ahead, by whoever can write the repository's build/models
    shared.chmod(0o555)
    monkeypatch.setenv("COURSE_MODELS_DIR", str(own))
    monkeypatch.setenv("COURSE_SHARED_MODELS_DIR", str(shared))
    try:
        assert models.tiny_llama().path == str(shared / models.SMOKE_DIR)
        assert models.tiny_qwen2().path == str(own / models.TINY_QWEN2_DIR)  # not shared: built in their own
    finally:
        shared.chmod(0o755)


def test_without_root_the_hub_says_what_it_needs(monkeypatch, capsys):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setattr(hub, "Authenticator", object)  # as where jupyterhub is installed
    assert hub.main(["--users", "alice bob"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "needs root to keep learners apart" in err and "sudo make hub" in err


def test_a_room_too_small_is_refused_before_any_user_or_file_is_made(monkeypatch, capsys, tmp_path):
    made = []
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(hub, "Authenticator", object)
    monkeypatch.setattr(hub, "check_access", lambda: made.append("the first step of making the room"))
    monkeypatch.setattr(hub, "hub_dir", lambda: (_ for _ in ()).throw(CourseError("stopped here")))
    monkeypatch.setattr(hub.machine, "memory_bytes", lambda: 64 * 10**9)
    monkeypatch.delenv("HUB_CROWDED", raising=False)
    learners = " ".join(f"l{i}" for i in range(len(os.sched_getaffinity(0)) // 2 + 1))  # one more than the cores hold
    assert hub.main(["--users", learners]) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "cores and 64 GB: name at most" in err and made == [], err
    monkeypatch.setenv("HUB_CROWDED", "1")  # a try-out goes on, saying so
    assert hub.main(["--users", learners]) == 1
    out, err = capsys.readouterr()
    assert "HUB_CROWDED=1, so it goes on" in out and made and err.strip() == "make hub: stopped here"


def test_the_rooms_progress_shows_each_learners_own_verdicts(tmp_path, monkeypatch):
    """Each check() a learner runs is kept in their build folder; make hub-progress prints the room's table."""
    from helpers import exercises

    learners = {name: {"system": f"course-{name}", "home": str(tmp_path / name)} for name in ("alice", "bob", "carol")}
    monkeypatch.setenv("COURSE_BUILD_DIR", str(hub.learner_build(tmp_path / "alice")))
    exercises.check("01.2", ...)  # opened, not answered
    exercises.check("01.2", 3)  # wrong
    exercises.check("01.2", 3, solution=True)  # a solution cell's run is not the learner's answer
    exercises.record("01.2", True)
    exercises.record("01.2", False)  # once correct, it stays correct
    exercises.check("03.3", ...)
    monkeypatch.setenv("COURSE_BUILD_DIR", str(hub.learner_build(tmp_path / "bob")))
    exercises.check("03.3", 3)
    exercises.check("03.3", 4)
    rows = hub.progress(learners)
    assert rows == [{"learner": "alice", "01.2": "✅", "03.3": "·", "correct": 1},
                    {"learner": "bob", "01.2": "", "03.3": "❌2", "correct": 0},
                    {"learner": "carol", "01.2": "", "03.3": "", "correct": 0}]  # fmt: skip
    kept = json.loads((hub.learner_build(tmp_path / "alice") / exercises.PROGRESS).read_text())
    assert kept["01.2"]["tries"] == 3 and kept["03.3"] == {"status": "not answered", "tries": 0, "last": kept["03.3"]["last"]}
    assert "learner  01.2  03.3  correct" in hub.table(rows)


def test_collecting_or_removing_a_room_says_in_one_sentence_what_it_needs(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("COURSE_BUILD_DIR", str(tmp_path))
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert hub.main(["remove"]) == 1
    assert capsys.readouterr().err.strip() == "make hub-remove: it reads the learners' homes and removes accounts: run it as root, sudo make hub-remove."
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert hub.main(["collect"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "learners.json is missing: no room has been started here" in err, err


def test_a_certificate_is_refused_with_the_way_to_tls(monkeypatch, capsys):
    monkeypatch.setenv("HUB_SSL_CERT", "/etc/ssl/hub.pem")
    assert hub.main(["--users", "alice"]) == 1
    assert "put a TLS reverse proxy (nginx, Caddy) in front" in capsys.readouterr().err


# --- the hub itself, driven in Chromium ----------------------------------------------------------------------

LOGIN = """(() => {{ document.querySelector('#username_input').value = {name};
  document.querySelector('#password_input').value = {password};
  document.querySelector('#login_submit').click(); return true; }})()"""
LAB_READY = "typeof window.jupyterapp !== 'undefined' && !!window.jupyterapp.shell"
OPEN = """jupyterapp.restored.then(() => jupyterapp.commands.execute('docmanager:open', {{path: {path}}}))
  .then(w => {{ window.nb = w; return w.context.sessionContext.ready; }})
  .then(() => {{ jupyterapp.shell.activateById(window.nb.id); return true; }})"""
RUN_ALL = "jupyterapp.commands.execute('notebook:run-all-cells').then(() => true)"
PROGRESS = """(() => { const cells = window.nb.content.widgets.filter(c => c.model.type === 'code');
  const errors = []; for (const c of cells) for (let i = 0; i < c.model.outputs.length; i++) {
    const o = c.model.outputs.get(i).toJSON(); if (o.output_type === 'error') errors.push(o.ename + ': ' + o.evalue); }
  return {done: cells.filter(c => c.model.executionCount !== null).length, cells: cells.length, errors,
          status: window.nb.context.sessionContext.session.kernel.status}; })()"""
SAVE = "jupyterapp.commands.execute('docmanager:save').then(() => !window.nb.context.model.dirty)"
RUN_CODE = """new Promise(done => {{ const out = [];
  const future = window.nb.context.sessionContext.session.kernel.requestExecute({{code: {code}}});
  future.onIOPub = m => {{ if (m.header.msg_type === 'stream') out.push(m.content.text);
                          if (m.header.msg_type === 'error') out.push(m.content.ename); }};
  future.done.then(() => done(out.join('')));
}})"""
# the contents API through JupyterLab's own client (it sends the XSRF token the server asks of a script)
LISTING = "jupyterapp.serviceManager.contents.get('').then(m => m.content.map(i => i.name))"
FETCH = """fetch({url}, {{headers: {{'X-XSRFToken': (document.cookie.match(/_xsrf=([^;]+)/) || [])[1] || ''}}}})
  .then(r => r.status)"""
NOTEBOOK = "course/00_check_your_machine.ipynb"


def wait_for(chrome: browser.Browser, expression: str, seconds: float, what: str):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = chrome.evaluate(expression)
        if value:
            return value
        time.sleep(0.5)
    raise TimeoutError(f"{what} not within {seconds:.0f} s")


def learner_session(base: str, name: str, password: str) -> dict:
    """Log in as ``name`` through the login page, run notebook 00 in JupyterLab to its end, save it, and look
    at what this learner can see; in a Chromium of its own (its own cookies)."""
    chrome = browser.Browser(timeout=240)
    try:
        assert chrome.open(base + "hub/login")["status"] == 200
        chrome.evaluate(LOGIN.format(name=json.dumps(name), password=json.dumps(password)))
        wait_for(chrome, LAB_READY, 180, f"{name}'s JupyterLab")
        chrome.evaluate(OPEN.format(path=json.dumps(NOTEBOOK)))
        chrome.evaluate(RUN_ALL)
        deadline = time.monotonic() + 240
        while True:
            progress = chrome.evaluate(PROGRESS)
            if progress["errors"] or (progress["done"] == progress["cells"] and progress["status"] == "idle"):
                break
            assert time.monotonic() < deadline, f"{name}'s notebook did not finish: {progress}"
            time.sleep(1)
        assert chrome.evaluate(SAVE)
        return {
            "progress": progress,
            "whoami": chrome.evaluate(
                RUN_CODE.format(
                    code=json.dumps(
                        "import getpass, os, subprocess; print(getpass.getuser(), sorted(os.sched_getaffinity(0)), "
                        "os.environ['COURSE_BUILD_DIR']); "
                        "subprocess.Popen(['sleep', '600'], start_new_session=True)  # outlives its kernel"
                    )
                )
            ),  # fmt: skip
            "contents": chrome.evaluate(LISTING),
        }
    finally:
        chrome.close()


def peek(base: str, name: str, password: str, other: str, other_home: str) -> dict:
    """What ``name`` gets when they ask for ``other``'s server, and ``other``'s home from their own kernel."""
    chrome = browser.Browser(timeout=120)
    try:
        chrome.open(base + "hub/login")
        chrome.evaluate(LOGIN.format(name=json.dumps(name), password=json.dumps(password)))
        wait_for(chrome, LAB_READY, 120, f"{name}'s JupyterLab")
        chrome.evaluate(OPEN.format(path=json.dumps(NOTEBOOK)))
        home = chrome.evaluate(RUN_CODE.format(code=json.dumps(
            f"import os\ntry:\n    print(os.listdir({other_home!r}))\nexcept PermissionError:\n"
            "    print('PermissionError')")))  # fmt: skip
        model = chrome.evaluate(RUN_CODE.format(code=json.dumps(
            "from helpers import models\nprint(models.tiny_llama().path)")))  # fmt: skip
        server = chrome.evaluate(FETCH.format(url=json.dumps(f"/user/{other}/api/contents/")))
        page = chrome.open(base + f"user/{other}/lab")["status"]
        return {
            "model": model,
            "home": home,
            "server": server,
            "page": page,
            "text": chrome.evaluate("document.body.innerText"),
        }
    finally:
        chrome.close()


def open_to_others() -> list[tuple[Path, int]]:
    """Let the learners' users reach the course's Python for this test (on a machine where it sits under
    root's home); returns what to restore."""
    changed = []
    for path in hub.needed_by_learners():
        for folder, mode in hub.closed_to_others(path):
            changed.append((folder, stat.S_IMODE(folder.stat().st_mode)))
            folder.chmod(changed[-1][1] | (stat.S_IXOTH | (stat.S_IROTH if mode == "o+rx" else 0)))
    return changed


def remove_user(login: str) -> None:
    subprocess.run(["userdel", "--remove", login], capture_output=True)
    try:
        grp.getgrnam(login)
        subprocess.run(["groupdel", login], capture_output=True)
    except KeyError:
        pass


def test_two_learners_log_in_run_notebook_00_side_by_side_and_see_only_their_own(tmp_path):
    need_chromium()
    need_root()
    prefix = f"t{uuid.uuid4().hex[:6]}-"
    names = ["alice", "bob"]
    logins = [prefix + name for name in names]
    port = launching.free_port()
    base = f"http://127.0.0.1:{port}/"
    build = Path(os.environ["COURSE_BUILD_DIR"]) / f"hub-{prefix}"
    # a try-out on a small machine: two learners on what may be fewer than 4 cores and 16 GB
    env = {**os.environ, "COURSE_BUILD_DIR": str(build), "HUB_PREFIX": prefix, "PROFILE": "smoke", "HUB_CROWDED": "1"}
    restore = open_to_others()
    log = (tmp_path / "hub.log").open("w")
    started = time.monotonic()
    process = subprocess.Popen([sys.executable, "-m", "course.hub", "--users", " ".join(names), "--port", str(port)],
                               cwd=paths.ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if urllib.request.urlopen(base + "hub/login", timeout=5).status == 200:
                    break
            except OSError:
                pass
            assert process.poll() is None, (tmp_path / "hub.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the hub did not answer within 120 s"
            time.sleep(0.5)
        secrets = hub.read_passwords(build / "hub" / "passwords")
        assert stat.S_IMODE((build / "hub" / "passwords").stat().st_mode) == 0o600
        homes = {name: pwd.getpwnam(prefix + name).pw_dir for name in names}
        assert all(stat.S_IMODE(os.stat(home).st_mode) == 0o700 for home in homes.values())
        with ThreadPoolExecutor(2) as pool:  # both at the same time
            seen = dict(
                zip(names, pool.map(lambda n: learner_session(base, n, secrets[n]), names), strict=True)
            )
        looked = peek(base, "alice", secrets["alice"], "bob", homes["bob"])
        for name in names:
            report = seen[name]
            assert not report["progress"]["errors"], report["progress"]
            assert report["whoami"].split(" ", 1)[0] == prefix + name, report["whoami"]
            assert f"{homes[name]}/build" in report["whoami"]
            own = sorted(
                entry.name for entry in Path(homes[name]).iterdir() if not entry.name.startswith(".")
            )
            assert "course" in own and sorted(report["contents"]) == own, (report["contents"], own)
            saved = json.loads((Path(homes[name]) / NOTEBOOK).read_text())
            code = [cell for cell in saved["cells"] if cell["cell_type"] == "code"]
            assert all(cell["execution_count"] for cell in code)
            assert any("every one holds 3 after all_reduce" in "".join(o.get("text", "")) for c in code
                       for o in c["outputs"])  # fmt: skip
            assert os.stat(Path(homes[name]) / NOTEBOOK).st_uid == pwd.getpwnam(prefix + name).pw_uid
        cores = [seen[name]["whoami"].split(" [", 1)[1].split("]")[0] for name in names]
        assert cores[0] != cores[1] or len(os.sched_getaffinity(0)) == 1, cores
        assert looked["server"] == 403 and looked["page"] == 403, looked
        assert looked["home"].strip() == "PermissionError", looked
        # the smoke model `make hub` built ahead, read where the learner cannot write
        assert looked["model"].strip() == str(paths.models_dir() / "tiny-llama-smoke"), looked
        # make hub-collect while the room runs: each learner's executed notebook, in an archive of their own
        collected = subprocess.run([sys.executable, "-m", "course.hub", "collect"], cwd=paths.ROOT, env=env,
                                   capture_output=True, text=True, timeout=120)  # fmt: skip
        assert collected.returncode == 0, collected.stderr
        for name in names:
            [archive] = (build / "hub" / hub.COLLECTED).glob(f"{name}-*.tgz")
            with tarfile.open(archive) as tar:
                handed_in = json.loads(tar.extractfile(f"{name}/{NOTEBOOK}").read())
            assert handed_in == json.loads((Path(homes[name]) / NOTEBOOK).read_text()), name
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)  # as `kill` of make hub
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
        log.close()
        uids = set()
        for login in logins:
            try:
                uids.add(pwd.getpwnam(login).pw_uid)
            except KeyError:
                pass
        left = [p for p in psutil.process_iter(["uids", "cmdline", "status"]) if p.info["status"] != psutil.STATUS_ZOMBIE
                and ((p.info["uids"] and p.info["uids"].real in uids) or str(port) in " ".join(p.info["cmdline"] or []))]  # fmt: skip
        for proc in left:
            proc.kill()
        for login in logins:
            remove_user(login)
        for folder, mode in restore:
            folder.chmod(mode)
        shutil.rmtree(build, ignore_errors=True)
        print(f"hub test: {time.monotonic() - started:.0f} s")
    assert not left, f"processes left after the hub stopped: {[p.info['cmdline'] for p in left]}"
    assert process.returncode is not None


def need_root() -> None:
    if os.geteuid() != 0:
        if os.environ.get("CI") == "true" and os.environ.get("GITHUB_ACTIONS") != "true":  # GitHub's runner is no root
            pytest.fail("the hub's test needs root (one system user per learner), and CI (.ci/run) runs as root")
        pytest.skip("the hub needs root to create one system user per learner; run the tests as root")


def test_the_rooms_work_is_collected_learner_by_learner_and_no_account_goes_before_its_work(tmp_path, monkeypatch):
    """make hub-collect archives each learner's own files (not another's, not a link's target, not the merged
    models); make hub-remove refuses while any learner's work changed since their archive, then removes them."""
    need_root()
    prefix = f"t{uuid.uuid4().hex[:6]}-"
    build = tmp_path / "build"
    monkeypatch.setenv("COURSE_BUILD_DIR", str(build))
    learners = {}
    try:
        for name in ("alice", "bob"):
            user = hub.system_user(prefix, name, home_base=str(tmp_path))
            home = Path(user.pw_dir)
            for relative, text in ((f"{hub.NOTEBOOKS}/03.ipynb", f"{name}'s ring"), ("build/outputs/run/v1/a.txt", name),
                                   ("build/outputs/self-cognition-merged/v1/model.bin", "0.5 GB"), (".bashrc", "")):  # fmt: skip
                (home / relative).parent.mkdir(parents=True, exist_ok=True)
                (home / relative).write_text(text)
            for entry in home.rglob("*"):
                os.lchown(entry, user.pw_uid, user.pw_gid)
            learners[name] = {"system": user.pw_name, "home": user.pw_dir}
        alice = Path(learners["alice"]["home"])
        (alice / hub.NOTEBOOKS / "shadow").symlink_to("/etc/shadow")  # a link: kept as a link, never its target
        (alice / hub.NOTEBOOKS / "roots.txt").write_text("not hers")  # root's file in her folder: not hers to hand in
        os.lchown(alice / hub.NOTEBOOKS / "shadow", pwd.getpwnam(learners["alice"]["system"]).pw_uid, -1)
        (build / "hub").mkdir(parents=True)
        (build / "hub" / "learners.json").write_text(json.dumps(learners))
        with pytest.raises(CourseError, match=r"alice has no archive; bob has no archive: run make hub-collect first"):
            hub.remove(learners)
        rows = hub.collect(hub.chosen(hub.room(), []))
        assert [row["learner"] for row in rows] == ["alice", "bob"]
        for name in learners:
            [archive] = (build / "hub" / hub.COLLECTED).glob(f"{name}-*.tgz")
            assert stat.S_IMODE(archive.stat().st_mode) == 0o600
            with tarfile.open(archive) as tar:
                members = {m.name: m for m in tar.getmembers()}
                assert tar.extractfile(f"{name}/course/03.ipynb").read().decode() == f"{name}'s ring"
                assert f"{name}/build/outputs/run/v1/a.txt" in members
            assert not any("self-cognition-merged" in m or "roots.txt" in m or ".bashrc" in m for m in members), members
            assert all(m.startswith(f"{name}/") for m in members), members
            if name == "alice":
                assert members["alice/course/shadow"].issym()
        (Path(learners["bob"]["home"]) / hub.NOTEBOOKS / "03.ipynb").write_text("bob, later")  # after his archive
        with pytest.raises(CourseError, match=r"^bob changed files after .*bob-.*\.tgz: run make hub-collect first"):
            hub.remove(learners)
        assert pwd.getpwnam(learners["alice"]["system"])  # refused: no one removed
        assert hub.main(["collect", "--users", "bob"]) == 0  # as make hub-collect USERS=bob
        assert len(list((build / "hub" / hub.COLLECTED).glob("bob-*.tgz"))) == 2  # the first one kept
        rows = hub.remove(hub.chosen(hub.room(), []))
        assert [row["learner"] for row in rows] == ["alice", "bob"]
        for learner in learners.values():
            with pytest.raises(KeyError):
                pwd.getpwnam(learner["system"])
            assert not Path(learner["home"]).exists()
        assert json.loads((build / "hub" / "learners.json").read_text()) == {}
        with pytest.raises(CourseError, match=r"USERS names carol, not in the room; it has alice bob"):
            hub.chosen(learners, ["carol"])
    finally:
        for learner in learners.values():
            remove_user(learner["system"])


def test_notebooks_are_handed_out_once_and_a_learners_own_file_is_never_replaced(tmp_path):
    source = tmp_path / "student"
    (source / "zh").mkdir(parents=True)
    (source / "00_a.ipynb").write_text("new")
    (source / "zh" / "00_a.ipynb").write_text("new zh")
    me = pwd.getpwuid(os.getuid())
    home = tmp_path / "home"
    home.mkdir()
    user = pwd.struct_passwd((me.pw_name, "x", me.pw_uid, me.pw_gid, "", str(home), "/bin/sh"))
    (home / hub.NOTEBOOKS).mkdir()
    (home / hub.NOTEBOOKS / "00_a.ipynb").write_text("the learner's work")
    assert hub.hand_out(source, user) == 1
    assert (home / hub.NOTEBOOKS / "00_a.ipynb").read_text() == "the learner's work"
    assert (home / hub.NOTEBOOKS / "zh" / "00_a.ipynb").read_text() == "new zh"
    assert hub.hand_out(source, user) == 0
