"""The ``PYTORCH_CUDA_ALLOC_CONF`` settings the allocator model honours, and their parser.

:class:`AllocatorConfig` holds the modelled settings; :meth:`AllocatorConfig.from_env_string` parses an
environment value with the syntax and checks of ``c10/core/AllocatorConfig.cpp`` (``parseArgs``,
``parseRoundUpPower2Divisions``) and :meth:`AllocatorConfig.to_env_string` writes it back.
"""

from __future__ import annotations

from dataclasses import dataclass

from frenzy_opt.prediction.marp.allocator.sizes import K_LARGE_BUFFER, ROUNDUP_INTERVALS, MiB

__all__ = ["AllocatorConfig"]

_MODELLED_KEYS = ("expandable_segments", "max_split_size_mb", "max_non_split_rounding_mb", "roundup_power2_divisions")
# Keys PyTorch accepts that do not change device-memory accounting (host pinned memory, locking, graphs).
_IGNORED_KEYS = (
    "backend",
    "release_lock_on_cudamalloc",
    "pinned_use_cuda_host_register",
    "pinned_num_register_threads",
    "pinned_use_background_threads",
    "pinned_reserve_segment_size_mb",
    "graph_capture_record_stream_reuse",
)
_UNMODELLED_KEYS = {
    "garbage_collection_threshold": "it frees cached segments only under set_per_process_memory_fraction, which "
    "this model does not implement; drop the key to predict without it",
}


def _is_power_of_two(value: int) -> bool:
    return value > 0 and value & (value - 1) == 0


@dataclass(frozen=True, slots=True)
class AllocatorConfig:
    """The ``PYTORCH_CUDA_ALLOC_CONF`` settings the model honours (defaults = PyTorch's defaults)."""

    expandable_segments: bool = False
    max_split_size_bytes: int | None = None
    """``max_split_size_mb`` in bytes; ``None`` = unlimited (every block may be split). At least 20 MiB."""
    max_non_split_rounding_bytes: int = K_LARGE_BUFFER
    """``max_non_split_rounding_mb`` in bytes: how much larger than an oversize request a reused oversize
    block may be. At least 20 MiB."""
    roundup_power2_divisions: int | tuple[int, ...] | None = None
    """One division count for all sizes (a power of two), or one per size interval: 16 values, 0 or a power
    of two, for sizes below 2 MiB, then [2^k, 2^(k+1)) MiB for k = 1 .. 14, then 32 GiB and above.
    ``None``, 0 and 1 round to 512-byte multiples only."""

    def __post_init__(self) -> None:
        if self.max_split_size_bytes is not None and self.max_split_size_bytes < K_LARGE_BUFFER:
            raise ValueError(f"max_split_size_bytes must be >= {K_LARGE_BUFFER} (20 MiB), as PyTorch requires")
        if self.max_non_split_rounding_bytes < K_LARGE_BUFFER:
            raise ValueError(f"max_non_split_rounding_bytes must be >= {K_LARGE_BUFFER} (20 MiB), as PyTorch requires")
        divisions = self.roundup_power2_divisions
        if isinstance(divisions, int) and not _is_power_of_two(divisions):
            raise ValueError(f"roundup_power2_divisions must be a power of two, got {divisions}")
        if isinstance(divisions, tuple) and (
            len(divisions) != ROUNDUP_INTERVALS or any(d != 0 and not _is_power_of_two(d) for d in divisions)
        ):
            raise ValueError(f"roundup_power2_divisions needs {ROUNDUP_INTERVALS} values, each 0 or a power of two")

    def divisions_table(self) -> tuple[int, ...] | None:
        """The per-interval division counts, or ``None`` when no interval rounds beyond 512 bytes."""
        divisions = self.roundup_power2_divisions
        table = (divisions,) * ROUNDUP_INTERVALS if isinstance(divisions, int) else divisions
        return table if table is not None and any(d > 1 for d in table) else None

    @classmethod
    def from_env_string(cls, text: str) -> AllocatorConfig:
        """Parse a ``PYTORCH_CUDA_ALLOC_CONF`` value such as ``"expandable_segments:True,max_split_size_mb:128"``.

        The syntax and checks follow ``c10/core/AllocatorConfig.cpp`` (``parseArgs``): ``key:value`` pairs
        separated by commas, ``roundup_power2_divisions`` either one power of two or a list
        ``[64:8,256:4,>:1]`` of size-in-MiB intervals. Keys that do not change device memory (pinned-memory
        and locking options, ``backend:native``) are accepted and ignored; unknown or unmodelled keys raise
        :class:`ValueError` naming the key and the keys allowed.
        """
        tokens = _lex(text)
        expandable = False
        max_split: int | None = None
        rounding = K_LARGE_BUFFER
        divisions: int | tuple[int, ...] | None = None
        allowed = ", ".join((*_MODELLED_KEYS, *_IGNORED_KEYS))
        i = 0
        while i < len(tokens):
            key = tokens[i]
            if key in _UNMODELLED_KEYS:
                raise ValueError(f"allocator option {key!r} is not modelled: {_UNMODELLED_KEYS[key]}")
            if key not in _MODELLED_KEYS and key not in _IGNORED_KEYS:
                raise ValueError(f"unknown allocator option {key!r}; allowed keys: {allowed}")
            i = _expect(tokens, i + 1, ":", key)
            if key == "roundup_power2_divisions" and i < len(tokens) and tokens[i] == "[":
                divisions, i = _parse_divisions_list(tokens, i + 1)
            else:
                if i >= len(tokens) or tokens[i] in ",:[]":
                    raise ValueError(f"allocator option {key!r} needs a value")
                value = tokens[i]
                i += 1
                if key == "expandable_segments":
                    if value not in ("True", "False"):
                        raise ValueError(f"allocator option {key!r} needs True or False, got {value!r}")
                    expandable = value == "True"
                elif key in ("max_split_size_mb", "max_non_split_rounding_mb"):
                    megabytes = _parse_int(key, value)
                    if megabytes < K_LARGE_BUFFER // MiB:
                        raise ValueError(
                            f"allocator option {key!r} must be >= {K_LARGE_BUFFER // MiB}, got {megabytes}"
                        )
                    if key == "max_split_size_mb":
                        max_split = megabytes * MiB
                    else:
                        rounding = megabytes * MiB
                elif key == "roundup_power2_divisions":
                    divisions = _parse_int(key, value)
                    if not _is_power_of_two(divisions):
                        raise ValueError(f"allocator option {key!r} must be a power of two, got {divisions}")
                elif key == "backend" and value != "native":
                    raise ValueError(f"allocator backend {value!r} is not modelled; only 'native' is")
            if i < len(tokens):
                i = _expect(tokens, i, ",", key)
        return cls(expandable, max_split, rounding, divisions)

    def to_env_string(self) -> str:
        """The ``PYTORCH_CUDA_ALLOC_CONF`` value that sets this configuration (``""`` for the defaults)."""
        parts: list[str] = []
        if self.expandable_segments:
            parts.append("expandable_segments:True")
        for key, value in (
            ("max_split_size_mb", self.max_split_size_bytes),
            ("max_non_split_rounding_mb", self.max_non_split_rounding_bytes),
        ):
            if value is None or (key == "max_non_split_rounding_mb" and value == K_LARGE_BUFFER):
                continue
            if value % MiB:
                raise ValueError(f"{key} is set in whole MiB; {value} bytes is not a multiple of {MiB}")
            parts.append(f"{key}:{value // MiB}")
        divisions = self.roundup_power2_divisions
        if isinstance(divisions, int):
            parts.append(f"roundup_power2_divisions:{divisions}")
        elif divisions is not None:
            listed = ",".join(f"{1 << index}:{d}" for index, d in enumerate(divisions))
            parts.append(f"roundup_power2_divisions:[{listed}]")
        return ",".join(parts)


def _lex(text: str) -> list[str]:
    """Split on ``, : [ ]`` (kept as tokens), dropping spaces (``AllocatorConfig::lexArgs``)."""
    tokens: list[str] = []
    word: list[str] = []
    for char in text:
        if char in ",:[]":
            if word:
                tokens.append("".join(word))
                word = []
            tokens.append(char)
        elif not char.isspace():
            word.append(char)
    if word:
        tokens.append("".join(word))
    return tokens


def _expect(tokens: list[str], i: int, token: str, key: str) -> int:
    if i >= len(tokens) or tokens[i] != token:
        found = tokens[i] if i < len(tokens) else "the end"
        raise ValueError(f"allocator option {key!r}: expected {token!r}, found {found!r}")
    return i + 1


def _parse_int(key: str, text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"allocator option {key!r} needs an integer, got {text!r}") from None


def _parse_divisions_list(tokens: list[str], i: int) -> tuple[tuple[int, ...], int]:
    """``[interval_mb:divisions, ..., >:divisions]`` after the ``[`` (``parseRoundUpPower2Divisions``).

    An interval ``m`` (a power of two, in MiB) sets the divisions of sizes in ``[m, 2m)`` MiB; the first
    entry also covers every smaller size; ``>`` covers every interval after the last one named.
    """
    key = "roundup_power2_divisions"
    table = [0] * ROUNDUP_INTERVALS
    first = True
    last_index = 0
    while True:
        if i >= len(tokens):
            raise ValueError(f"allocator option {key!r}: missing ']'")
        if tokens[i] == "]":
            return tuple(table), i + 1
        interval = tokens[i]
        i = _expect(tokens, i + 1, ":", key)
        if i >= len(tokens):
            raise ValueError(f"allocator option {key!r}: missing a division count")
        divisions = _parse_int(key, tokens[i])
        i += 1
        if divisions != 0 and not _is_power_of_two(divisions):
            raise ValueError(f"allocator option {key!r}: divisions must be 0 or a power of two, got {divisions}")
        if interval == ">":
            for index in range(last_index + 1, ROUNDUP_INTERVALS):
                table[index] = divisions
        else:
            megabytes = _parse_int(key, interval)
            if not _is_power_of_two(megabytes):
                raise ValueError(f"allocator option {key!r}: intervals must be powers of two, got {megabytes}")
            index = min(megabytes.bit_length() - 1, ROUNDUP_INTERVALS - 1)
            if first:
                for lower in range(index):
                    table[lower] = divisions
                first = False
            table[index] = divisions
            last_index = index
        if i < len(tokens) and tokens[i] == ",":
            i += 1
