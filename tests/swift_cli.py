"""Read a ``swift`` command shown as text back through SWIFT's own parser (swift/utils/utils.py, parse_args)."""

import shlex


def parse(command: str, arguments_class) -> dict:
    """The values SWIFT's parser for ``arguments_class`` (SftArguments, ExportArguments, ...) reads from the
    text of a ``swift <sub>`` command; fails on any flag SWIFT does not know."""
    from swift.utils.utils import _patch_get_type_hints
    from transformers import HfArgumentParser

    words = shlex.split(command.replace("\\\n", " "))
    argv = words[words.index("swift") + 2 :]  # after any VAR=value words, `swift` and its subcommand
    with _patch_get_type_hints():
        namespace, unknown = HfArgumentParser([arguments_class]).parse_known_args(argv)
    assert unknown == [], f"flags SWIFT does not know: {unknown}"
    return vars(namespace)
