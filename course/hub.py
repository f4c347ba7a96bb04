"""`make hub`: one JupyterHub for a room of learners, each kept apart from the others.

Every learner named in USERS becomes a system user of their own (``course-<name>``, created if missing, home
mode 0700), logs in with their own password (generated here, printed once and kept in build/hub/passwords,
mode 0600; an instructor may write their own there first, one ``name password`` a line), and gets:

- the student notebooks (`make student`) copied into ``~/course`` (a file already there is never replaced);
- their own build/, outputs and models folders in their home (the course models built ahead in the
  repository's build/models are read from there, read-only; see helpers/models.py);
- a fixed share of this machine's CPU cores, every core handed out (CPU affinity, which the course's profile and
  torch's threads follow), and one GPU each where GPUs exist (CUDA_VISIBLE_DEVICES).

Before anything is created it refuses, in one sentence, a room with less per learner than `make check` asks of
one learner's machine: 2 cores and 7.5 GB of memory (HUB_CROWDED=1 goes on anyway, for a try-out).

The hub runs as root (only root can create those users and start a server as each of them) from the course's
.venv, on 127.0.0.1:8000 unless HUB_IP / HUB_PORT say otherwise. Its proxy, the pure-Python
configurable-http-proxy, serves plain HTTP only: for TLS, keep the hub on 127.0.0.1 and put a reverse proxy that
holds the certificate (nginx, Caddy) in front of it. Ctrl-C, or a SIGTERM, stops the hub, its proxy and every
learner's server.
"""

import argparse
import asyncio
import contextlib
import hmac
import json
import os
import pwd
import re
import secrets
import shutil
import stat
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from course import machine
from helpers import launching, paths
from helpers.errors import CourseError

PREFIX = "course-"
NAME = re.compile(
    r"[a-z][a-z0-9]{0,15}"
)  # a learner's name: the hub's user name and the end of the system user's
PREFIX_FORM = re.compile(r"[a-z][a-z0-9-]{0,14}")
HOME_BASE = "/home"
NOTEBOOKS = "course"  # the folder in each home that holds the learner's notebooks
PROXY = ("import sys; from configurable_http_proxy.cli import main; "
         "sys.argv[0] = 'configurable-http-proxy'; sys.exit(main())")  # fmt: skip


def hub_dir() -> Path:
    return paths.build_dir() / "hub"


# --- what the instructor asked for -------------------------------------------------------------------------


def parse_users(text: str | None) -> list[str]:
    """The learners' names in USERS (separated by spaces or commas), checked."""
    names = [name for name in re.split(r"[\s,]+", text or "") if name]
    if not names:
        raise CourseError('USERS is empty; name the learners, e.g. make hub USERS="alice bob".')
    for name in names:
        if not NAME.fullmatch(name):
            raise CourseError(
                f"USERS has {name!r}, which is not a valid user name; use 1 to 16 lower-case letters and digits, "
                "starting with a letter (e.g. alice, bob2)."
            )
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise CourseError(f"USERS names {', '.join(repeated)} more than once; name each learner once.")
    return names


def check_prefix(prefix: str) -> str:
    if not PREFIX_FORM.fullmatch(prefix.rstrip("-")) or not prefix.endswith("-"):
        raise CourseError(
            f"HUB_PREFIX = {prefix!r} is not a valid prefix for system user names; use lower-case letters, "
            "digits and hyphens, starting with a letter and ending in '-' (e.g. course-)."
        )
    return prefix


def check_port(value) -> int:
    try:
        port = int(value)
    except (TypeError, ValueError):
        port = 0
    if not 1 <= port <= 65535:
        raise CourseError(
            f"HUB_PORT = {value!r} is not a port; use a whole number from 1 to 65535, e.g. 8000."
        )
    return port


def core_shares(cores: list[int], learners: int) -> list[list[int]]:
    """Every one of ``cores`` handed out, in order: shares that differ by one core at most, the first learners
    taking the extra ones; with fewer cores than learners (HUB_CROWDED), each gets one, taken in turn."""
    cores = sorted(cores)
    if len(cores) < learners:
        return [[cores[i % len(cores)]] for i in range(learners)]
    each, extra = divmod(len(cores), learners)
    starts = [i * each + min(i, extra) for i in range(learners + 1)]
    return [cores[starts[i] : starts[i + 1]] for i in range(learners)]


def room_problem(learners: int, cores: int, memory_bytes: int) -> str | None:
    """Why this machine cannot hold ``learners`` with what `make check` asks of one learner's machine
    (machine.CORES cores and machine.MEMORY_GB GB each), or None."""
    memory_gb = memory_bytes / 1e9
    if cores >= learners * machine.CORES and memory_gb >= learners * machine.MEMORY_GB:
        return None
    most = max(0, min(cores // machine.CORES, int(memory_gb // machine.MEMORY_GB)))
    return (f"{learners} learners need {learners * machine.CORES} cores and {learners * machine.MEMORY_GB:.0f} GB of "
            f"memory ({machine.CORES} cores and {machine.MEMORY_GB} GB each), and this machine gives the hub {cores} "
            f"cores and {memory_gb:.0f} GB: name at most {most} learners in USERS, use a bigger machine, or set "
            "HUB_CROWDED=1 for a try-out in which notebooks run slower and may run out of memory.")  # fmt: skip


def count_gpus() -> int:
    """NVIDIA GPUs on this machine (nvidia-smi's list; 0 without one)."""
    if shutil.which("nvidia-smi") is None:
        return 0
    listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    return (
        sum(line.startswith("GPU ") for line in listed.stdout.splitlines()) if listed.returncode == 0 else 0
    )


# --- what the learners' servers must be able to read -----------------------------------------------------------


def closed_to_others(path: Path) -> list[tuple[Path, str]]:
    """The folders on the way to ``path`` that a user other than their owner cannot pass through, and ``path``
    itself if they cannot list it: (folder, the chmod that opens it)."""
    path = Path(path)
    closed = [(folder, "o+x") for folder in path.parents if not folder.stat().st_mode & stat.S_IXOTH]
    need = stat.S_IXOTH | stat.S_IROTH
    if path.stat().st_mode & need != need:
        closed.append((path, "o+rx"))
    return closed


def needed_by_learners() -> list[Path]:
    """What each learner's server reads: the repository (the course's helpers) and the .venv's Python, which
    may live in another folder (the interpreter it was made from)."""
    python = Path(sys.executable)
    return [paths.ROOT, python.parent, python.resolve().parent, Path(os.path.realpath(sys.base_prefix))]


def check_access() -> None:
    closed = sorted({entry for path in needed_by_learners() for entry in closed_to_others(path)})
    if closed:
        fix = "; ".join(f"chmod {mode} {folder}" for folder, mode in closed)
        raise CourseError(
            f"the learners' servers run the course's Python as the learners' own users and cannot reach "
            f"{', '.join(str(folder) for folder, _ in closed)}; run `{fix}` (or keep the repository and its "
            "Python where every user can read them) and start the hub again."
        )


# --- the learners ---------------------------------------------------------------------------------------------


def system_user(prefix: str, name: str, home_base: str = HOME_BASE) -> pwd.struct_passwd:
    """The system user of learner ``name``, created (with a home of mode 0700) if missing."""
    login = prefix + name
    try:
        found = pwd.getpwnam(login)
    except KeyError:
        home = Path(home_base) / login
        subprocess.run(["useradd", "--create-home", "--home-dir", str(home), "--user-group", "--shell", "/bin/bash",
                        login], check=True, capture_output=True)  # fmt: skip
        found = pwd.getpwnam(login)
    os.chmod(found.pw_dir, 0o700)
    return found


def student_notebooks() -> Path:
    """build/student/, written by `make student`'s own code if it is not there yet."""
    folder = paths.build_dir() / "student"
    if not any(folder.glob("00_*.ipynb")):
        from course import student

        student.write(folder)
    return folder


def hand_out(source: Path, user: pwd.struct_passwd) -> int:
    """Copy the notebooks under ``source`` into the learner's ~/course, never over a file already there;
    returns how many were copied."""
    target = Path(user.pw_dir) / NOTEBOOKS
    copied = 0
    for path in sorted(source.rglob("*.ipynb")):
        destination = target / path.relative_to(source)
        for folder in [*reversed(destination.relative_to(user.pw_dir).parents)][1:]:
            folder = Path(user.pw_dir) / folder
            if not folder.exists():
                folder.mkdir()
                os.chown(folder, user.pw_uid, user.pw_gid)
        if destination.exists():
            continue
        shutil.copyfile(path, destination)
        os.chown(destination, user.pw_uid, user.pw_gid)
        copied += 1
    return copied


def read_passwords(path: Path) -> dict[str, str]:
    if not path.exists():
        return {}
    lines = (line.split(None, 1) for line in path.read_text().splitlines() if line.strip() and line[0] != "#")
    return {parts[0]: parts[1].strip() for parts in lines if len(parts) == 2}


def passwords(path: Path, names: list[str]) -> tuple[dict[str, str], list[str]]:
    """Each learner's password: the one in ``path`` (mode 0600), or a new one written there; returns them all
    and the names that got a new one."""
    known = read_passwords(path)
    new = [name for name in names if name not in known]
    known.update({name: secrets.token_urlsafe(9) for name in new})
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write("# learner password (make hub; keep this file private)\n")
        handle.writelines(f"{name} {secret}\n" for name, secret in known.items())
    os.chmod(path, 0o600)
    return known, new


def models_ahead(profile: str, gpus: int) -> str:
    """Build the profile's course model once into build/models, where every learner reads it (read-only); the
    gpu profile's model comes from ModelScope into each learner's own cache. Returns what it did, in words."""
    chosen = profile if profile != "auto" else ("gpu" if gpus else "cpu")
    if chosen == "gpu":
        return "the gpu profile's model is downloaded by each learner's first run into their own cache"
    which = "smoke" if chosen == "smoke" else "cpu"
    print(
        f"hub: making the {which} profile's model available to every learner (the first time: up to a minute) ..."
    )
    subprocess.run([sys.executable, "-m", "helpers.models", which], check=True, capture_output=True)
    closed = closed_to_others(paths.models_dir())
    if closed:
        return (f"{paths.relative(paths.models_dir())} is closed to the learners ({closed[0][1]} on {closed[0][0]} "
                "would open it): each builds the model in their own build/models")  # fmt: skip
    return f"the {which} profile's model is shared read-only from {paths.relative(paths.models_dir())}"


def learner_build(home: Path) -> Path:
    """A learner's build folder (COURSE_BUILD_DIR), in their home."""
    return home / "build"


def learner_environment(home: Path, cores: list[int], gpu: int | None, profile: str) -> dict[str, str]:
    """What a learner's server and kernels are given: their own folders, the shared models, their share."""
    build = learner_build(home)
    env = {
        "COURSE_BUILD_DIR": str(build),
        "COURSE_OUTPUTS_DIR": str(build / "outputs"),
        "COURSE_MODELS_DIR": str(build / "models"),
        "COURSE_SHARED_MODELS_DIR": str(paths.models_dir()),
        "OMP_NUM_THREADS": str(len(cores)),
        # the course's tools (torchrun, swift, ninja) first, as under make
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", os.defpath)]),
        "CUDA_VISIBLE_DEVICES": "" if gpu is None else str(gpu),
    }
    if profile != "auto":
        env["COURSE_PROFILE"] = profile
    return env


def stop_processes_of(uid: int, grace: float = 5) -> int:
    """End every process of the user ``uid`` (TERM, then KILL after ``grace`` seconds); returns how many."""
    import psutil

    mine = [p for p in psutil.process_iter(["uids"]) if p.info["uids"] and p.info["uids"].real == uid]
    for process in mine:
        with contextlib.suppress(psutil.Error):
            process.terminate()
    _, alive = psutil.wait_procs(mine, timeout=grace)
    for process in alive:
        with contextlib.suppress(psutil.Error):
            process.kill()
    return len(mine)


# --- after the day: each learner's work collected, then the accounts removed ------------------------------------

COLLECTED = "collected"  # build/hub/collected/<name>-<time>.tgz, root's, mode 0600
# left out of an archive: the models a run builds again, and 10's merged models (0.5 GB each)
LEFT_OUT = ("build/models", "build/outputs/self-cognition-merged")


def room() -> dict:
    """The learners of the last `make hub` (build/hub/learners.json): name -> system user, home, cores, ..."""
    record = hub_dir() / "learners.json"
    if not record.is_file():
        raise CourseError(f"{paths.relative(record)} is missing: no room has been started here (make hub USERS=...).")
    return json.loads(record.read_text())


def chosen(learners: dict, names: list[str]) -> dict:
    """``names`` of the room, all of it when empty; a name not in it is refused."""
    unknown = [name for name in names if name not in learners]
    if unknown:
        raise CourseError(f"USERS names {', '.join(unknown)}, not in the room; it has {' '.join(learners)}.")
    return {name: learners[name] for name in names} if names else learners


def collect(learners: dict) -> list[dict]:
    """Each learner's ~/course and ~/build (less LEFT_OUT) into a new archive under build/hub/collected/, only the
    files the learner owns (a link is kept as a link); returns one row per learner for the table."""
    folder = hub_dir() / COLLECTED
    folder.mkdir(parents=True, exist_ok=True)
    os.chmod(folder, 0o700)
    stamp, rows = time.strftime("%Y%m%d-%H%M%S"), []
    for name, learner in learners.items():
        home, uid = Path(learner["home"]), pwd.getpwnam(learner["system"]).pw_uid
        names = (folder / f"{name}-{stamp}{f'-{n}' if n else ''}.tgz" for n in range(1000))
        target = next(path for path in names if not path.exists())

        def theirs(info, name=name, uid=uid):
            left_out = any(info.name == f"{name}/{part}" or info.name.startswith(f"{name}/{part}/") for part in LEFT_OUT)
            return None if left_out or info.uid != uid else info

        with tarfile.open(target, "x:gz") as archive:  # x: never over another archive
            os.chmod(target, 0o600)
            for part in (NOTEBOOKS, "build"):
                if (home / part).is_dir():
                    archive.add(home / part, arcname=f"{name}/{part}", filter=theirs)
        rows.append({"learner": name, "archive": paths.relative(target), "size": f"{target.stat().st_size / 1e6:.1f} MB"})
    return rows


def progress(learners: dict) -> list[dict]:
    """The room's progress, one row per learner: each exercise anyone has answered, ✅ once correct, ❌ and the
    answers tried so far, · when only opened; read from each learner's build/progress.json (exercises.record)."""
    from helpers.exercises import PROGRESS

    kept = {}
    for name, learner in learners.items():
        try:
            kept[name] = json.loads((learner_build(Path(learner["home"])) / PROGRESS).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            kept[name] = {}
    answered = sorted({exercise for seen in kept.values() for exercise, entry in seen.items() if entry["tries"]})

    def mark(entry):
        if not entry:
            return ""
        return "✅" if entry["status"] == "correct" else f"❌{entry['tries']}" if entry["tries"] else "·"

    return [{"learner": name, **{exercise: mark(seen.get(exercise)) for exercise in answered},
             "correct": sum(entry["status"] == "correct" for entry in seen.values())}
            for name, seen in kept.items()]  # fmt: skip


def newest_change(home: Path) -> float:
    """The latest modification time of what collect() archives in ``home`` (0 when there is nothing)."""
    newest = 0.0
    for part in (NOTEBOOKS, "build"):
        for folder, dirs, files in os.walk(home / part):
            relative = Path(folder).relative_to(home).as_posix()
            dirs[:] = [d for d in dirs if f"{relative}/{d}" not in LEFT_OUT]
            for entry in [".", *dirs, *files]:
                with contextlib.suppress(OSError):
                    newest = max(newest, os.lstat(os.path.join(folder, entry)).st_mtime)
    return newest


def uncollected(name: str, home: Path) -> str | None:
    """Why learner ``name``'s work is not safely collected, or None: no archive, or a change since the newest."""
    archives = sorted((hub_dir() / COLLECTED).glob(f"{name}-*.tgz"), key=lambda a: a.stat().st_mtime)
    if not archives:
        return f"{name} has no archive"
    if newest_change(home) > archives[-1].stat().st_mtime:
        return f"{name} changed files after {paths.relative(archives[-1])}"
    return None


def remove(learners: dict) -> list[dict]:
    """Stop each learner's processes, delete their system user, home and group, and take them out of the room;
    refuses, removing no one, while anyone's work is not collected (make hub-collect first)."""
    problems = [why for name, learner in learners.items() if (why := uncollected(name, Path(learner["home"])))]
    if problems:
        raise CourseError(f"{'; '.join(problems)}: run make hub-collect first, then make hub-remove again.")
    rows, record = [], room()
    for name, learner in learners.items():
        stopped = stop_processes_of(pwd.getpwnam(learner["system"]).pw_uid)
        subprocess.run(["userdel", "--remove", learner["system"]], check=True, capture_output=True)
        if subprocess.run(["getent", "group", learner["system"]], capture_output=True).returncode == 0:
            subprocess.run(["groupdel", learner["system"]], check=True, capture_output=True)
        record.pop(name, None)
        rows.append({"learner": name, "system user": f"{learner['system']} (removed)", "processes stopped": stopped})
    paths.write_atomic(hub_dir() / "learners.json", json.dumps(record, indent=1))
    return rows


# --- JupyterHub's side: who logs in, how a server starts --------------------------------------------------------

try:
    from jupyterhub.auth import Authenticator
    from jupyterhub.spawner import LocalProcessSpawner, set_user_setuid
    from traitlets import Unicode
except ImportError:  # jupyterhub is not installed (make setup installs it): main() says so
    Authenticator = LocalProcessSpawner = None
else:

    class CourseAuthenticator(Authenticator):
        """A learner's name and the password in build/hub/passwords."""

        passwords_file = Unicode(help="the file of `name password` lines").tag(config=True)

        async def authenticate(self, handler, data):
            name, given = (data.get("username") or "").strip().lower(), data.get("password") or ""
            known = read_passwords(Path(self.passwords_file)).get(name)
            if known is not None and hmac.compare_digest(known.encode(), given.encode()):
                return name
            return None

    class CourseSpawner(LocalProcessSpawner):
        """A learner's server: as their system user, on their share of the cores, with their own folders."""

        learners_file = Unicode(help="build/hub/learners.json, written by course.hub").tag(config=True)

        def learner(self) -> dict:
            return json.loads(Path(self.learners_file).read_text())[self.user.name]

        def make_preexec_fn(self, name):
            learner = self.learner()
            become = set_user_setuid(learner["system"])

            def preexec():
                os.sched_setaffinity(0, learner["cores"])  # kept by every process the server starts
                become()

            return preexec

        async def stop(self, now=False):
            """Stop the server, then whatever of the learner's is still running (a kernel's launch that outlived
            it): the system user is the learner's alone, so none of their processes should outlive the hub."""
            await super().stop(now=now)
            uid = pwd.getpwnam(self.learner()["system"]).pw_uid
            await asyncio.get_running_loop().run_in_executor(None, stop_processes_of, uid)

        def user_env(self, env):
            learner = self.learner()
            user = pwd.getpwnam(learner["system"])
            env.update(USER=user.pw_name, LOGNAME=user.pw_name, HOME=user.pw_dir, SHELL=user.pw_shell)
            env.update(learner["environment"])
            return env


# --- starting it -----------------------------------------------------------------------------------------------


def write_config(folder: Path, names: list[str], ip: str, port: int) -> Path:
    python = sys.executable
    lines = [
        "# Written by `make hub` (course/hub.py) each time it starts; edit course/hub.py, not this file.",
        "from course.hub import CourseAuthenticator, CourseSpawner",
        "c = get_config()  # noqa: F821",
        f"c.JupyterHub.ip = {ip!r}",
        f"c.JupyterHub.port = {port}",
        f"c.JupyterHub.hub_port = {launching.free_port()}",
        f"c.ConfigurableHTTPProxy.api_url = 'http://127.0.0.1:{launching.free_port()}'",
        f"c.ConfigurableHTTPProxy.command = [{python!r}, '-c', {PROXY!r}]",
        f"c.ConfigurableHTTPProxy.pid_file = {str(folder / 'proxy.pid')!r}",
        f"c.JupyterHub.pid_file = {str(folder / 'hub.pid')!r}",
        f"c.JupyterHub.db_url = 'sqlite:///{folder / 'jupyterhub.sqlite'}'",
        f"c.JupyterHub.cookie_secret_file = {str(folder / 'cookie_secret')!r}",
        "c.JupyterHub.cleanup_servers = True",
        "c.JupyterHub.cleanup_proxy = True",
        "c.JupyterHub.authenticator_class = CourseAuthenticator",
        f"c.CourseAuthenticator.passwords_file = {str(folder / 'passwords')!r}",
        f"c.Authenticator.allowed_users = {set(names)!r}",
        "c.JupyterHub.spawner_class = CourseSpawner",
        f"c.CourseSpawner.learners_file = {str(folder / 'learners.json')!r}",
        f"c.Spawner.cmd = [{python!r}, '-m', 'jupyterhub.singleuser']",
        "c.Spawner.args = ['--LabApp.expose_app_in_browser=True']",
        f"c.Spawner.default_url = '/lab/tree/{NOTEBOOKS}'",
        "c.Spawner.start_timeout = 180",
        "c.Spawner.http_timeout = 180",
        "c.LocalProcessSpawner.interrupt_timeout = 10",
        "c.LocalProcessSpawner.term_timeout = 5",
    ]
    config = folder / "jupyterhub_config.py"
    config.write_text("\n".join(lines) + "\n")
    return config


def prepare(
    names: list[str], prefix: str, profile: str, home_base: str = HOME_BASE
) -> tuple[Path, list[dict]]:
    """Everything but starting the hub: the users, their notebooks, passwords and shares; returns build/hub
    and one row per learner for the table."""
    if os.geteuid() != 0:
        raise CourseError(
            "the hub needs root to keep learners apart (one system user each, a server started as each of them); "
            f'run it as root: sudo make hub USERS="{" ".join(names)}".'
        )
    cores = sorted(os.sched_getaffinity(0))
    problem = room_problem(len(names), len(cores), machine.memory_bytes())
    if problem and os.environ.get("HUB_CROWDED") != "1":
        raise CourseError(problem)
    if problem:
        print(f"hub: HUB_CROWDED=1, so it goes on: {problem.split(':')[0]}.")
    check_access()
    folder = hub_dir()
    folder.mkdir(parents=True, exist_ok=True)
    os.chmod(folder, 0o700)
    source = student_notebooks()
    known, new = passwords(folder / "passwords", names)
    shares = core_shares(cores, len(names))
    gpus = count_gpus()
    print(f"hub: {models_ahead(profile, gpus)}.")
    learners, rows = {}, []
    for i, (name, cores) in enumerate(zip(names, shares, strict=True)):
        user = system_user(prefix, name, home_base)
        copied = hand_out(source, user)
        gpu = i % gpus if gpus else None
        learners[name] = {
            "system": user.pw_name,
            "home": user.pw_dir,
            "cores": cores,
            "environment": learner_environment(Path(user.pw_dir), cores, gpu, profile),
        }
        rows.append({"learner": name, "password": known[name] if name in new else "(unchanged, in build/hub/passwords)",
                     "system user": user.pw_name, "cores": ",".join(map(str, cores)),
                     "GPU": "-" if gpu is None else str(gpu), "notebooks copied": copied})  # fmt: skip
    paths.write_atomic(folder / "learners.json", json.dumps(learners, indent=1))
    os.chmod(folder / "learners.json", 0o600)
    if gpus and len(names) > gpus:
        print(f"hub: {len(names)} learners and {gpus} GPUs: some GPUs are shared (column GPU).")
    return folder, rows


def table(rows: list[dict]) -> str:
    keys = list(rows[0])
    width = {k: max(len(k), *(len(str(r[k])) for r in rows)) for k in keys}
    line = lambda values: "  ".join(str(v).ljust(width[k]) for k, v in zip(keys, values, strict=True))  # noqa: E731
    return "\n".join([line(keys), line("-" * width[k] for k in keys), *(line(r.values()) for r in rows)])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", nargs="?", default="start", choices=("start", "collect", "remove", "progress"))
    parser.add_argument("--users", default=os.environ.get("USERS", ""))
    parser.add_argument("--ip", default=os.environ.get("HUB_IP") or "127.0.0.1")
    parser.add_argument("--port", default=os.environ.get("HUB_PORT") or "8000")
    parser.add_argument("--prefix", default=os.environ.get("HUB_PREFIX") or PREFIX)
    parser.add_argument("--profile", default=os.environ.get("PROFILE") or "auto")
    parser.add_argument("--home-base", default=os.environ.get("HUB_HOME_BASE") or HOME_BASE)
    args = parser.parse_args(argv)
    if args.action != "start":
        try:
            if os.geteuid() != 0:
                raise CourseError(f"it reads the learners' homes{' and removes accounts' if args.action == 'remove' else ''}: "
                                  f"run it as root, sudo make hub-{args.action}.")  # fmt: skip
            learners = chosen(room(), parse_users(args.users) if args.users.strip() else [])
            print(table({"collect": collect, "remove": remove, "progress": progress}[args.action](learners)))
        except CourseError as exc:
            print(f"make hub-{args.action}: {exc}", file=sys.stderr)
            return 1
        return 0
    try:
        names = parse_users(args.users)
        port, prefix = check_port(args.port), check_prefix(args.prefix)
        if args.profile not in ("auto", "cpu", "gpu", "smoke"):
            raise CourseError(
                f"PROFILE = {args.profile!r} is not valid; choose 'auto', 'cpu', 'gpu' or 'smoke'."
            )
        if os.environ.get("HUB_SSL_CERT") or os.environ.get("HUB_SSL_KEY"):
            raise CourseError(
                "HUB_SSL_CERT / HUB_SSL_KEY cannot be served: the hub's proxy (configurable-http-proxy for Python) "
                "speaks plain HTTP only; keep the hub on 127.0.0.1 and put a TLS reverse proxy (nginx, Caddy) in front."
            )
        if Authenticator is None:
            raise CourseError(
                "jupyterhub is not installed in this Python; run `make setup` (make hub does it first)."
            )
        folder, rows = prepare(names, prefix, args.profile, args.home_base)
    except CourseError as exc:
        print(f"make hub: {exc}", file=sys.stderr)
        return 1
    config = write_config(folder, names, args.ip, port)
    print(table(rows))
    print(
        f"\nNew passwords are shown once here and kept in {paths.relative(folder / 'passwords')} (mode 0600)."
    )
    print(f"The hub: http://{args.ip}:{port}/  (Ctrl-C stops it and every learner's server)", flush=True)
    os.chdir(folder)  # what JupyterHub writes beside itself stays in build/hub
    os.execv(sys.executable, [sys.executable, "-m", "jupyterhub", "-f", str(config)])


if __name__ == "__main__":
    sys.exit(main())
