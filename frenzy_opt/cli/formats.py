"""``frenzy import`` and ``reference``: a job spec from the formats users have, and the field reference of the
formats we read."""

from __future__ import annotations

import argparse
import sys
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

import yaml
from rich.console import Console

if TYPE_CHECKING:  # the report pulls in matplotlib: imported when compare runs
    pass
from frenzy_opt.cli.common import _emit


def cmd_import(args: argparse.Namespace) -> int:
    from frenzy_opt.formats import import_spec

    if (args.file is None) == (args.args is None):
        raise ValueError("import: give FILE, or for megatron --args='--num-layers ...' (not both)")
    if args.args is not None and args.format != "megatron":
        raise ValueError("import: --args is for megatron argument lists; give FILE")
    result = import_spec(args.format, args.file, text=args.args, name=args.name, runtime=args.runtime,
                         global_batch_size=args.global_batch_size, vocab_size=args.vocab_size)  # fmt: skip
    text = yaml.safe_dump(result.spec, sort_keys=False)
    if args.out:
        Path(args.out).write_text(text, encoding="utf-8")
    for note in result.notes:
        sys.stderr.write(f"frenzy import: note: {note}\n")
    payload = {"format": args.format, "source": args.file or "--args", "out": args.out, **asdict(result)}

    def show(_: Console) -> None:
        sys.stdout.write(f"wrote {args.out}\n" if args.out else text)

    _emit(args, payload, show)
    return 0


def cmd_reference(args: argparse.Namespace) -> int:
    from frenzy_opt.cli.fieldref import payload, render

    def show(_: Console) -> None:
        sys.stdout.write(render())

    _emit(args, payload(), show)
    return 0
