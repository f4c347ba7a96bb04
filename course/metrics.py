"""The metrics an executed notebook recorded with helpers.report.record, read back from its outputs."""

from helpers.report import MIME


def collect(notebook) -> list[dict]:
    """The metrics a (parsed, executed) notebook recorded, in order; later values win."""
    found: dict[str, dict] = {}
    for cell in notebook.get("cells", []):
        for output in cell.get("outputs", []):
            payload = output.get("data", {}).get(MIME)
            if payload:
                found.pop(payload["name"], None)
                found[payload["name"]] = payload
    return list(found.values())
