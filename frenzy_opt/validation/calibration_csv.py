"""The calibration format's CSV files (``../shared/calibration/*.csv``; their README describes the columns):
the rows of a file, and the numbers in the free-text cells published sources write.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Sequence
from pathlib import Path


def read_rows(path: str | Path, required: Sequence[str]) -> list[dict[str, str]]:
    """The rows of a calibration-format CSV file; ``ValueError`` naming the file when it cannot be read or
    lacks one of the ``required`` columns."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise ValueError(f"cannot read {path}: {err.strerror}") from None
    reader = csv.DictReader(text.splitlines())
    missing = [c for c in required if c not in (reader.fieldnames or [])]
    if missing:
        raise ValueError(f"{path}: missing column(s) {', '.join(missing)}; required: {', '.join(required)}")
    return list(reader)


def first_int(text: str, column: str, row_id: str) -> int:
    match = re.search(r"\d+", text.replace(",", ""))
    if match is None:
        raise ValueError(f"row {row_id}: column {column} must start with an integer, got {text!r}")
    return int(match.group())


def vocab_of(text: str, row_id: str) -> int:
    padded = re.search(r"padded\s+(\d+)", text)
    if padded:
        return int(padded.group(1))
    numbers = [int(n) for n in re.findall(r"\d+", text) if int(n) > 1000]
    if not numbers:
        raise ValueError(f"row {row_id}: column vocab must hold the vocabulary size, got {text!r}")
    return numbers[0]
