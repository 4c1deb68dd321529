"""The runtime profile table (frenzy_opt/core/runtime_profile.py): one row per runtime, beside its capability
row, whose named choices come from the sets the models know, and an unknown runtime refused by name."""

from __future__ import annotations

import pytest

from frenzy_opt.core.enums import Runtime
from frenzy_opt.core.partition import SPLIT_RULES
from frenzy_opt.core.runtime_profile import DP_OVERLAPS, PROFILES, STATE_LAYOUTS, profile
from frenzy_opt.core.runtimes import capabilities


@pytest.mark.parametrize("runtime", list(Runtime))
def test_every_runtime_has_one_row_beside_its_capabilities(runtime: Runtime) -> None:
    row = profile(runtime.value)
    assert row.capabilities is capabilities(runtime.value)
    assert row.state_layout in STATE_LAYOUTS and row.pipeline_split in SPLIT_RULES
    assert {row.dp_overlap, row.dp_overlap_with_pp} <= set(DP_OVERLAPS)
    assert row.default_zero_stage in row.capabilities.zero_stages
    assert not row.chunked_loss or row.default_loss_chunks >= 1


def test_the_table_has_no_row_without_a_runtime() -> None:
    assert set(PROFILES) == set(Runtime)


def test_an_unknown_runtime_is_refused_naming_the_runtimes() -> None:
    with pytest.raises(ValueError, match=r"training\.runtime must be one of megatron"):
        profile("jax")
