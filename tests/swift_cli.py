"""Read a ``swift`` command shown as text back through SWIFT's own parser (swift/utils/utils.py, parse_args)."""


def parse(command: str, arguments_class) -> dict:
    """The values SWIFT's parser for ``arguments_class`` (SftArguments, ExportArguments, ...) reads from the
    text of a ``swift <sub>`` command; fails on any flag SWIFT does not know."""
    from swift.utils.utils import _patch_get_type_hints
    from transformers import HfArgumentParser

    from helpers import swiftcli

    _, _, argv = swiftcli.parse_swift_text(command)
    with _patch_get_type_hints():
        namespace, unknown = HfArgumentParser([arguments_class]).parse_known_args(argv)
    assert unknown == [], f"flags SWIFT does not know: {unknown}"
    return vars(namespace)
