"""The CUDA caching-allocator model (frenzy_opt.prediction.marp.allocator): hand-worked cases that follow from
the rules of c10/cuda/CUDACachingAllocator.cpp, the PYTORCH_CUDA_ALLOC_CONF parser, properties over random
traces, and (on a machine with a CUDA device) the model against the real allocator."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from frenzy_opt.prediction.marp.allocator.config import AllocatorConfig
from frenzy_opt.prediction.marp.allocator.model import AllocatorOutOfMemoryError, AllocatorStats, CachingAllocatorModel
from frenzy_opt.prediction.marp.allocator.replay import MemEvent, replay
from frenzy_opt.prediction.marp.allocator.sizes import K_LARGE_BUFFER, K_SMALL_BUFFER, allocation_size, round_size

MiB = 1024 * 1024
DEFAULT = AllocatorConfig()
EXPANDABLE = AllocatorConfig(expandable_segments=True)


def alloc(block: int, size: int, phase: str = "", stream: int = 0) -> MemEvent:
    return MemEvent("alloc", block, size, phase, stream)


def free(block: int, phase: str = "") -> MemEvent:
    return MemEvent("free", block, 0, phase)


def checked_replay(
    events: Sequence[MemEvent], config: AllocatorConfig = DEFAULT, capacity: int | None = None
) -> AllocatorStats:
    """replay(), with the model's internal consistency checked after every event and the same answer."""
    model = CachingAllocatorModel(config, capacity_bytes=capacity)
    for event in events:
        model.set_phase(event.phase)
        if event.action == "alloc":
            model.malloc(event.block, event.size, event.stream)
        else:
            model.free(event.block)
        model.check_invariants()
    stats = replay(events, config, capacity_bytes=capacity)
    assert stats == model.stats(stats.oom_events)
    return stats


# -- sizes and segments ------------------------------------------------------------------------------------


def test_a_tiny_request_takes_512_bytes_of_a_2_mib_small_segment() -> None:
    stats = checked_replay([alloc(1, 100)])
    assert stats.peak_requested_bytes == 100
    assert stats.peak_allocated_bytes == 512
    assert stats.peak_reserved_bytes == 2 * MiB
    assert (stats.num_segments, stats.num_cudamalloc_calls) == (1, 1)


def test_small_requests_pack_into_one_small_segment() -> None:
    # 4 x 512 KiB = 2 MiB exactly: the fourth takes the last 512 KiB, the fifth needs a second segment.
    events = [alloc(i, 512 * 1024) for i in range(5)]
    assert checked_replay(events[:4]).peak_reserved_bytes == 2 * MiB
    assert checked_replay(events).peak_reserved_bytes == 4 * MiB


def test_just_over_1_mib_is_a_large_request_with_a_20_mib_segment() -> None:
    stats = checked_replay([alloc(1, MiB + 1)])
    assert stats.peak_reserved_bytes == 20 * MiB
    assert stats.peak_allocated_bytes == MiB + 512  # split: the 19 MiB remainder stays cached
    assert checked_replay([alloc(1, MiB)]).peak_reserved_bytes == 2 * MiB  # 1 MiB is still small


def test_a_30_mib_request_reserves_30_mib() -> None:
    stats = checked_replay([alloc(1, 30 * MiB)])
    assert stats.peak_reserved_bytes == 30 * MiB
    assert stats.peak_allocated_bytes == 30 * MiB


def test_a_large_block_is_not_split_for_a_remainder_of_1_mib_or_less() -> None:
    # 31 MiB - 1 B rounds to 31 MiB, its segment to 32 MiB; the 1 MiB remainder is not > kSmallSize.
    stats = checked_replay([alloc(1, 31 * MiB - 1)])
    assert stats.peak_reserved_bytes == 32 * MiB
    assert stats.peak_allocated_bytes == 32 * MiB


def test_round_size_and_allocation_size() -> None:
    assert [round_size(s) for s in (1, 511, 512, 513, 1025)] == [512, 512, 512, 1024, 1536]
    assert allocation_size(MiB) == K_SMALL_BUFFER
    assert allocation_size(MiB + 512) == K_LARGE_BUFFER
    assert allocation_size(10 * MiB - 512) == K_LARGE_BUFFER
    assert allocation_size(10 * MiB) == 10 * MiB
    assert allocation_size(11 * MiB) == 12 * MiB


def test_freeing_and_allocating_the_same_size_reuses_the_segment() -> None:
    events = [alloc(1, 30 * MiB), free(1), alloc(2, 30 * MiB), free(2), alloc(3, 25 * MiB)]
    stats = checked_replay(events)
    assert stats.peak_reserved_bytes == 30 * MiB
    assert stats.num_cudamalloc_calls == 1
    assert stats.reserved_bytes == 30 * MiB  # freed memory stays reserved (cached)


def test_best_fit_picks_the_smallest_cached_block_that_fits() -> None:
    # Cached: 30 MiB and 50 MiB. A 28 MiB request takes the 30 MiB one, so 45 MiB still fits the 50 MiB one.
    events = [alloc(1, 50 * MiB), alloc(2, 30 * MiB), free(1), free(2), alloc(3, 28 * MiB), alloc(4, 45 * MiB)]
    stats = checked_replay(events)
    assert stats.peak_reserved_bytes == 80 * MiB
    assert stats.num_cudamalloc_calls == 2


def test_freed_neighbours_merge_within_a_segment() -> None:
    # Three 6 MiB blocks in one 20 MiB segment; freeing all three leaves one 20 MiB block for an 18 MiB request.
    events = [alloc(1, 6 * MiB), alloc(2, 6 * MiB), alloc(3, 6 * MiB), free(1), free(3), free(2), alloc(4, 18 * MiB)]
    stats = checked_replay(events)
    assert stats.peak_reserved_bytes == 20 * MiB
    assert stats.num_segments == 1


FRAGMENTING = [alloc(1, 6 * MiB), alloc(2, 6 * MiB), alloc(3, 6 * MiB), free(1), free(3), alloc(4, 12 * MiB)]


def test_fragmentation_needs_a_new_segment_without_expandable_segments() -> None:
    # A|B|C|2 MiB in one 20 MiB segment; with A and C free the holes are 6 and 8 MiB: 12 MiB needs a segment.
    stats = checked_replay(FRAGMENTING)
    assert stats.num_segments == 2
    assert stats.peak_reserved_bytes == 20 * MiB + 12 * MiB


def test_fragmentation_grows_the_one_expandable_segment_instead() -> None:
    # The 8 MiB hole at the end sits in front of unmapped space: one 20 MiB page more makes it 28 MiB.
    stats = checked_replay(FRAGMENTING, EXPANDABLE)
    assert stats.num_segments == 1
    assert stats.num_cudamalloc_calls == 0
    assert stats.peak_reserved_bytes == 40 * MiB


def test_expandable_segments_let_freed_blocks_serve_a_larger_request() -> None:
    # Two cached 12 MiB segments cannot hold 24 MiB; in one expandable segment the two blocks are neighbours.
    events = [alloc(1, 12 * MiB), alloc(2, 12 * MiB), free(1), free(2), alloc(3, 24 * MiB)]
    assert checked_replay(events).peak_reserved_bytes == 48 * MiB
    assert checked_replay(events, EXPANDABLE).peak_reserved_bytes == 40 * MiB
    growing = [alloc(1, 30 * MiB), free(1), alloc(2, 32 * MiB)]
    assert checked_replay(growing).peak_reserved_bytes == 62 * MiB
    assert checked_replay(growing, EXPANDABLE).peak_reserved_bytes == 40 * MiB


def test_expandable_pages_are_2_mib_small_and_20_mib_large() -> None:
    assert checked_replay([alloc(1, 100)], EXPANDABLE).peak_reserved_bytes == 2 * MiB
    assert checked_replay([alloc(1, MiB + 1)], EXPANDABLE).peak_reserved_bytes == 20 * MiB
    stats = checked_replay([alloc(1, 30 * MiB), alloc(2, 100)], EXPANDABLE)
    assert stats.peak_reserved_bytes == 40 * MiB + 2 * MiB
    assert stats.peak_allocated_bytes == 30 * MiB + 512  # the block is split at 512 bytes, not 1 MiB
    assert stats.num_segments == 2  # one per pool


def test_empty_cache_releases_whole_free_segments_only() -> None:
    model = CachingAllocatorModel()
    model.malloc(1, 6 * MiB)
    model.malloc(2, 6 * MiB)
    model.malloc(3, 30 * MiB)
    model.free(1)
    model.free(3)
    model.empty_cache()
    model.check_invariants()
    assert model.reserved_bytes == 20 * MiB  # the 30 MiB segment goes; the 20 MiB one still holds block 2
    model.free(2)
    model.empty_cache()
    assert model.reserved_bytes == 0
    assert model.stats().num_segments == 0


def test_empty_cache_unmaps_whole_free_pages_of_an_expandable_segment() -> None:
    model = CachingAllocatorModel(EXPANDABLE)
    model.malloc(1, 30 * MiB)  # pages 0-1 of the large segment
    model.malloc(2, 30 * MiB)  # 30-60 MiB: page 2
    model.free(1)
    model.empty_cache()  # 0-30 MiB is free: only page 0 (0-20 MiB) is whole
    model.check_invariants()
    assert model.reserved_bytes == 40 * MiB
    model.free(2)
    model.empty_cache()
    model.check_invariants()
    assert model.reserved_bytes == 0
    assert model.stats().num_segments == 0


# -- max_split_size, roundup_power2_divisions ----------------------------------------------------------------


MAX_SPLIT_40 = AllocatorConfig(max_split_size_bytes=40 * MiB)


def test_max_split_size_keeps_oversize_blocks_for_oversize_requests() -> None:
    events = [alloc(1, 60 * MiB), free(1), alloc(2, 30 * MiB)]
    # Without the limit the cached 60 MiB block is split; with it a 30 MiB request may not take it.
    assert checked_replay(events).peak_reserved_bytes == 60 * MiB
    assert checked_replay(events, MAX_SPLIT_40).peak_reserved_bytes == 90 * MiB


def test_an_oversize_request_reuses_an_oversize_block_within_20_mib_unsplit() -> None:
    near = checked_replay([alloc(1, 60 * MiB), free(1), alloc(2, 45 * MiB)], MAX_SPLIT_40)
    assert near.peak_reserved_bytes == 60 * MiB
    assert near.peak_allocated_bytes == 60 * MiB  # not split: the whole block is allocated
    far = checked_replay([alloc(1, 100 * MiB), free(1), alloc(2, 70 * MiB)], MAX_SPLIT_40)
    assert far.peak_reserved_bytes == 170 * MiB  # 100 >= 70 + 20: a new segment
    wider = AllocatorConfig(max_split_size_bytes=40 * MiB, max_non_split_rounding_bytes=40 * MiB)
    assert checked_replay([alloc(1, 100 * MiB), free(1), alloc(2, 70 * MiB)], wider).peak_reserved_bytes == 100 * MiB


def test_roundup_power2_divisions() -> None:
    four = AllocatorConfig(roundup_power2_divisions=4)
    assert round_size(5 * MiB + 1, four) == 6 * MiB  # between 4 and 8 MiB in 1 MiB steps
    assert round_size(4 * MiB, four) == 4 * MiB
    assert round_size(1200, four) == 1536  # at most 512 * 4 bytes: plain 512-byte rounding
    assert round_size(3000, four) == 3072  # 2048 + 2 * 512 rounded up to the next 512-byte step
    stats = checked_replay([alloc(1, 5 * MiB + 1)], four)
    assert (stats.peak_allocated_bytes, stats.peak_reserved_bytes) == (6 * MiB, 20 * MiB)
    table = AllocatorConfig.from_env_string("roundup_power2_divisions:[256:1,512:2,1024:4,>:8]")
    assert table.roundup_power2_divisions == (1,) * 9 + (2, 4) + (8,) * 5
    assert round_size(300 * MiB, table) == 300 * MiB
    assert round_size(600 * MiB, table) == 768 * MiB
    assert round_size(3000 * MiB, table) == 3072 * MiB


# -- streams, capacity ---------------------------------------------------------------------------------------


def test_blocks_are_cached_per_stream() -> None:
    other_stream = [alloc(1, 100), free(1), alloc(2, 100, stream=1)]
    stats = checked_replay(other_stream)
    assert stats.peak_reserved_bytes == 4 * MiB
    assert stats.num_segments == 2
    same_stream = [alloc(1, 100, stream=1), free(1), alloc(2, 100, stream=1)]
    assert checked_replay(same_stream).peak_reserved_bytes == 2 * MiB
    large = [alloc(1, 30 * MiB, stream=0), free(1), alloc(2, 30 * MiB, stream=3)]
    assert checked_replay(large).peak_reserved_bytes == 60 * MiB
    assert checked_replay(large, EXPANDABLE).num_segments == 2


def test_a_failed_cudamalloc_frees_the_cache_and_retries() -> None:
    events = [alloc(1, 30 * MiB), free(1), alloc(2, 32 * MiB)]
    stats = checked_replay(events, capacity=40 * MiB)
    assert stats.num_alloc_retries == 1
    assert stats.num_ooms == 0
    assert stats.reserved_bytes == 32 * MiB  # the cached 30 MiB segment was released
    assert stats.peak_reserved_bytes == 32 * MiB
    assert stats.num_device_free == 1


def test_out_of_memory_is_recorded_or_raised() -> None:
    events = [alloc(1, 30 * MiB), alloc(2, 32 * MiB), free(2), free(1), alloc(3, 40 * MiB)]
    stats = checked_replay(events, capacity=40 * MiB)
    assert (stats.num_ooms, stats.num_alloc_retries, stats.oom_events) == (1, 2, (1,))
    assert stats.peak_reserved_bytes == 40 * MiB  # block 3 fits once block 1's segment is released
    with pytest.raises(AllocatorOutOfMemoryError, match="block 2"):
        replay(events, capacity_bytes=40 * MiB, raise_on_oom=True)


def test_max_split_size_releases_just_enough_oversize_segments() -> None:
    # Cached 90 MiB and 30 MiB; a 65 MiB request may not take the 90 MiB block (90 >= 65 + 20) and does not fit
    # next to both: release_available_cached_blocks frees the 90 MiB one only, without a full retry.
    events = [alloc(1, 90 * MiB), alloc(2, 30 * MiB), free(1), free(2), alloc(3, 65 * MiB)]
    stats = checked_replay(events, AllocatorConfig(max_split_size_bytes=20 * MiB), capacity=130 * MiB)
    assert stats.reserved_bytes == 30 * MiB + 66 * MiB
    assert (stats.num_segments, stats.num_alloc_retries, stats.num_ooms) == (2, 0, 0)


def test_expandable_segments_under_a_capacity_unmap_before_failing() -> None:
    # 40 MiB mapped for block 1, then freed; a small-pool request needing a page beyond the capacity makes the
    # allocator unmap the free large pages and retry.
    events = [alloc(1, 30 * MiB), free(1), alloc(2, 100)]
    stats = checked_replay(events, EXPANDABLE, capacity=41 * MiB)
    assert (stats.num_alloc_retries, stats.num_ooms) == (1, 0)
    assert stats.reserved_bytes == 2 * MiB


def test_phases_record_the_reserved_peak_while_they_ran() -> None:
    events = [alloc(1, 30 * MiB, "forward"), alloc(2, 10 * MiB, "forward"), free(2, "backward"), free(1, "backward")]
    events += [alloc(3, 50 * MiB, "optimizer")]
    stats = checked_replay(events)
    # 30 and 10 MiB segments in the forward pass; both stay cached and cannot hold 50 MiB.
    assert stats.peak_phase_reserved == {"forward": 40 * MiB, "backward": 40 * MiB, "optimizer": 90 * MiB}
    assert stats.peak_phase_allocated == {"forward": 40 * MiB, "backward": 40 * MiB, "optimizer": 50 * MiB}


def test_bad_traces_are_rejected() -> None:
    with pytest.raises(ValueError, match="freed but not allocated"):
        replay([free(7)])
    with pytest.raises(ValueError, match="allocated twice"):
        replay([alloc(1, 10), alloc(1, 10)])
    with pytest.raises(ValueError, match="action"):
        replay([MemEvent("realloc", 1, 10)])
    with pytest.raises(ValueError, match="negative"):
        replay([alloc(1, -1)])
    stats = replay([alloc(1, 0), free(1)])  # a zero-byte storage never reaches the allocator
    assert stats.peak_reserved_bytes == 0


# -- PYTORCH_CUDA_ALLOC_CONF ---------------------------------------------------------------------------------


def test_the_env_string_parser() -> None:
    config = AllocatorConfig.from_env_string("expandable_segments:True,max_split_size_mb:128")
    assert config == AllocatorConfig(expandable_segments=True, max_split_size_bytes=128 * MiB)
    assert AllocatorConfig.from_env_string("") == AllocatorConfig()
    spaced = AllocatorConfig.from_env_string(
        " max_non_split_rounding_mb : 64 , backend:native,pinned_num_register_threads:8"
    )
    assert spaced == AllocatorConfig(max_non_split_rounding_bytes=64 * MiB)
    for config in (
        AllocatorConfig(expandable_segments=True, max_split_size_bytes=256 * MiB, roundup_power2_divisions=8),
        AllocatorConfig(max_non_split_rounding_bytes=30 * MiB, roundup_power2_divisions=(0, 2) * 8),
    ):
        assert AllocatorConfig.from_env_string(config.to_env_string()) == config


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("expandable_segment:True", "unknown allocator option 'expandable_segment'; allowed keys: expandable_segments"),
        ("garbage_collection_threshold:0.6", "'garbage_collection_threshold' is not modelled"),
        ("backend:cudaMallocAsync", "'cudaMallocAsync' is not modelled"),
        ("expandable_segments:true", "True or False"),
        ("max_split_size_mb:10", "must be >= 20"),
        ("max_split_size_mb", "expected ':'"),
        ("roundup_power2_divisions:3", "power of two"),
        ("roundup_power2_divisions:[64:8,128:3]", "power of two"),
        ("max_split_size_mb:64:32", "expected ','"),
    ],
)
def test_the_env_string_parser_names_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        AllocatorConfig.from_env_string(text)


def test_config_values_are_checked() -> None:
    with pytest.raises(ValueError, match="20 MiB"):
        AllocatorConfig(max_split_size_bytes=10 * MiB)
    with pytest.raises(ValueError, match="power of two"):
        AllocatorConfig(roundup_power2_divisions=6)
    with pytest.raises(ValueError, match="16 values"):
        AllocatorConfig(roundup_power2_divisions=(2, 4))


# -- properties ----------------------------------------------------------------------------------------------

SIZES = [1, 100, 512, 513, 4096, 300_000, MiB - 1, MiB, MiB + 1, 3 * MiB, 9 * MiB, 10 * MiB, 23 * MiB, 61 * MiB]
CONFIGS = [
    AllocatorConfig(),
    EXPANDABLE,
    AllocatorConfig(max_split_size_bytes=20 * MiB),
    AllocatorConfig(max_split_size_bytes=48 * MiB, roundup_power2_divisions=4),
    AllocatorConfig(expandable_segments=True, max_split_size_bytes=32 * MiB),
]
operations = st.lists(
    st.tuples(st.integers(0, 2), st.sampled_from(SIZES), st.integers(0, 1), st.integers(0, 10**6)),
    min_size=1,
    max_size=60,
)


def to_events(ops: Iterable[tuple[int, int, int, int]]) -> list[MemEvent]:
    """kind 0/1 allocates, kind 2 frees the live block picked by ``pick``; phases change every 10 events."""
    events: list[MemEvent] = []
    live: list[int] = []
    for n, (kind, size, stream, pick) in enumerate(ops):
        phase = f"p{n // 10}"
        if kind == 2 and live:
            events.append(free(live.pop(pick % len(live)), phase))
        else:
            events.append(alloc(n, max(0, size - pick % 7), phase, stream))
            live.append(n)
    return events


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=operations, config=st.sampled_from(CONFIGS), capacity=st.sampled_from([None, 64 * MiB, 160 * MiB]))
def test_properties_over_random_traces(
    ops: list[tuple[int, int, int, int]], config: AllocatorConfig, capacity: int | None
) -> None:
    events = to_events(ops)
    model = CachingAllocatorModel(config, capacity_bytes=capacity)
    live: dict[int, int] = {}
    peak_live_rounded = 0
    for event in events:
        model.set_phase(event.phase)
        if event.action == "alloc":
            if model.malloc(event.block, event.size, event.stream):
                live[event.block] = round_size(event.size, config) if event.size else 0
        else:
            model.free(event.block)
            live.pop(event.block, None)
        model.check_invariants()  # includes reserved >= allocated >= requested right now
        peak_live_rounded = max(peak_live_rounded, sum(live.values()))
        if capacity is not None:
            assert model.reserved_bytes <= capacity
    stats = model.stats()
    assert stats.peak_reserved_bytes >= stats.peak_allocated_bytes >= stats.peak_requested_bytes
    assert stats.peak_allocated_bytes >= peak_live_rounded
    assert stats.peak_reserved_bytes >= peak_live_rounded
    assert max(stats.peak_phase_reserved.values()) == stats.peak_reserved_bytes
    assert max(stats.peak_phase_allocated.values()) == stats.peak_allocated_bytes
    if capacity is None:
        assert stats.num_ooms == stats.num_alloc_retries == 0
    assert replay(events, config, capacity_bytes=capacity) == replay(events, config, capacity_bytes=capacity)


def training_like_trace(layers: int = 24, steps: int = 3, seed: int = 0) -> list[MemEvent]:
    """Weights and gradients, then per step activations kept for backward, temporaries, gradient frees."""
    rng = random.Random(seed)
    events: list[MemEvent] = []
    ids = iter(range(10**9))
    weights = [next(ids) for _ in range(layers)]
    for w in weights:
        events.append(alloc(w, rng.choice([4, 8, 16]) * MiB + rng.randrange(0, 4096), "setup"))
    for _ in range(steps):
        kept: list[int] = []
        for _ in range(layers):
            for _ in range(3):
                a = next(ids)
                kept.append(a)
                events.append(alloc(a, rng.randrange(1, 40) * MiB // 3 + rng.randrange(0, 1 << 16), "forward"))
            tmp = next(ids)
            events += [alloc(tmp, rng.randrange(100, 900_000), "forward"), free(tmp, "forward")]
        grads = []
        for _ in range(layers):
            g = next(ids)
            grads.append(g)
            events.append(alloc(g, rng.choice([4, 8, 16]) * MiB, "backward"))
            for _ in range(3):
                events.append(free(kept.pop(), "backward"))
        events += [free(g, "optimizer") for g in grads]
    return events


def random_trace(n: int, seed: int = 0, streams: int = 1) -> list[MemEvent]:
    rng = random.Random(seed)
    events: list[MemEvent] = []
    live: list[int] = []
    for block in range(n):
        if live and (rng.random() < 0.5 or len(live) > 400):
            events.append(free(live.pop(rng.randrange(len(live)))))
        else:
            scale = rng.choice([2_000, 200_000, 2 * MiB, 12 * MiB, 70 * MiB])
            events.append(alloc(block, rng.randint(1, scale), stream=rng.randrange(streams)))
            live.append(block)
    return events


def test_a_long_trace_replays_quickly() -> None:
    events = random_trace(60_000, seed=1)
    started = time.perf_counter()
    stats = replay(events)
    elapsed = time.perf_counter() - started
    assert stats.peak_reserved_bytes >= stats.peak_allocated_bytes
    assert elapsed < 3.0, f"{len(events)} events took {elapsed:.2f} s"  # about 0.2-0.4 s on a 2-core machine


# -- against the real allocator ------------------------------------------------------------------------------

REAL_RUN = r"""
import json, sys, torch
events = json.load(sys.stdin)
torch.cuda.init()
streams = {0: torch.cuda.current_stream()}
live = {}
torch.cuda.reset_peak_memory_stats()
for action, block, size, stream in events:
    if action == "alloc":
        if stream not in streams:
            streams[stream] = torch.cuda.Stream()
        with torch.cuda.stream(streams[stream]):
            live[block] = torch.empty(size, dtype=torch.uint8, device="cuda")
    else:
        del live[block]
stats = torch.cuda.memory_stats()
print(json.dumps({
    "reserved": torch.cuda.max_memory_reserved(),
    "allocated": torch.cuda.max_memory_allocated(),
    "requested": stats["requested_bytes.all.peak"],
    "segments": stats["segment.all.current"],
}))
"""


def cuda_available() -> bool:
    """torch.cuda.is_available(), without importing torch (seconds) on a machine with no NVIDIA driver."""
    if "torch" not in sys.modules and not (os.path.exists("/dev/nvidiactl") or shutil.which("nvidia-smi")):
        return False
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("config", "streams"),
    [(AllocatorConfig(), 1), (AllocatorConfig(), 2), (MAX_SPLIT_40, 1), (EXPANDABLE, 1)],
    ids=["default", "two-streams", "max-split-40", "expandable"],
)
def test_the_model_matches_the_real_allocator(config: AllocatorConfig, streams: int) -> None:
    if not cuda_available():
        pytest.skip("needs a CUDA device: torch.cuda.is_available() is False here")
    events = training_like_trace() + [
        MemEvent(e.action, e.block + 10**6, e.size, e.phase, e.stream) for e in random_trace(4000, 3, streams)
    ]
    env = {**os.environ, "PYTORCH_CUDA_ALLOC_CONF": config.to_env_string()}
    payload = json.dumps([(e.action, e.block, e.size, e.stream) for e in events])
    run = subprocess.run(
        [sys.executable, "-c", REAL_RUN], input=payload, env=env, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr
    real = json.loads(run.stdout.strip().splitlines()[-1])
    predicted = replay(events, config)
    # The model gives new segments increasing addresses; the real cudaMalloc's choice only matters for ties.
    assert predicted.peak_requested_bytes == real["requested"]
    assert predicted.peak_allocated_bytes == real["allocated"]
    assert predicted.peak_reserved_bytes == real["reserved"]
