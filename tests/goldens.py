"""Test helper: compare rendered text with a reviewed golden file (tests/golden/)."""

from __future__ import annotations

import os


def assert_matches_golden(text: str, path: str, what: str) -> None:
    """Assert ``text`` equals the golden file at ``path``; with ``UPDATE_GOLDEN=1`` in the
    environment, first rewrite the file with ``text`` (review the diff before committing).

    Args:
        text: the rendered output.
        path: the golden file.
        what: what was rendered, for the failure message (e.g. "manifest", "sbatch").
    """
    if os.environ.get("UPDATE_GOLDEN"):
        with open(path, "w") as f:
            f.write(text)
    with open(path) as f:
        assert text == f.read(), f"rendered {what} differs from {path}; UPDATE_GOLDEN=1 rewrites it after review"
