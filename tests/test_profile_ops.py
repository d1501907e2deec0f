"""bench/profile_ops.py's trace arithmetic, on hand-made kernel spans with a known answer."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from profile_ops import gpu_idle, host_reads  # noqa: E402


def test_gpu_idle_splits_calls_and_charges_gaps_to_the_next_kernel():
    spans = [  # (start_ns, end_ns, op): two calls; the second stream's kernel overlaps the first's
        (0, 10, "a"), (12, 20, "b"), (15, 25, "c"),  # call 1: span 25, idle 2 before b
        (1000, 1010, "a"), (1013, 1020, "b"),  # call 2 (975 ns after call 1: the host): span 20, idle 3
    ]
    span_ns, idle = gpu_idle(spans[::-1], calls=2)  # any order in
    assert span_ns == 45
    assert idle == {"b": pytest.approx((2 + 3) / 1e6 / 2)}
    assert gpu_idle([], calls=3) == (0.0, {})
    # one call: no gap is the host's
    assert gpu_idle(spans[:3], calls=1) == (25, {"b": pytest.approx(2 / 1e6)})


def test_host_reads_counts_device_to_host_copies_per_call():
    counts = {"copy:cond.38 [MemcpyD2H]": 16, "other:anonymous_mosaic_gpu_kernel": 248,
              "copy:input_concatenate_fusion_52": 80, "copy:memcpy128 [MemcpyD2D]": 8}
    assert host_reads(counts, 8) == 2.0
    assert host_reads({"fusion:loop_add_fusion": 5}, 5) == 0.0
