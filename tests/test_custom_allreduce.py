"""vLLM's custom all-reduce for small messages: which kernel vLLM picks, what each costs, the
fit on measured kernel times, and the NCCL fallback. Expected figures are worked out by hand
from the kernels' forms (docs/cost-model.md, "Tensor parallelism")."""

from __future__ import annotations

import numpy as np
import pytest

from sim.config.hardware import AllReduceKernel, CustomAllReduce
from sim.config.loader import load_hardware
from sim.cost import cost_model_for
from sim.cost.collectives import CollectiveParams, one_stage
from sim.errors import ConfigError
from tests.test_tensor_parallel import config
from validation.commfit import fit_custom

KiB, MiB = 1024, 2**20
CUSTOM = CustomAllReduce(
    max_bytes={2: 8 * MiB, 4: 8 * MiB, 8: 256 * KiB},
    one_stage=AllReduceKernel(latency=5e-6, bandwidth=400e9),
    two_stage=AllReduceKernel(latency=12e-6, bandwidth=200e9),
)
PARAMS = CollectiveParams(bandwidth=450e9, latency_s=17e-6, custom=CUSTOM)


@pytest.mark.parametrize(
    ("nbytes", "workers", "expected"),
    [
        (8 * MiB - 1, 2, True),  # always one stage on two GPUs
        (512 * KiB - 1, 4, True),
        (512 * KiB, 4, False),
        (256 * KiB - 1, 8, True),
        (256 * KiB, 6, False),
    ],
)
def test_vllm_picks_the_one_stage_kernel_by_size(nbytes, workers, expected):
    assert one_stage(nbytes, workers) is expected


def test_each_kernel_by_hand():
    # one stage, 4 GPUs, 128 KiB: 5 us + 3 x 131072 B / 400 GB/s
    assert PARAMS.all_reduce_s(128 * KiB, 4) == pytest.approx(5e-6 + 3 * 131072 / 400e9)
    # two stage, 4 GPUs, 1 MiB: 12 us + 1.5 x 1048576 B / 200 GB/s
    assert PARAMS.all_reduce_s(MiB, 4) == pytest.approx(12e-6 + 1.5 * MiB / 200e9)


@pytest.mark.parametrize(
    ("nbytes", "workers"),
    [(8 * MiB, 4), (256 * KiB, 8), (64 * KiB, 3), (64 * KiB, 6)],  # too big, or no limit
)
def test_other_messages_go_to_nccl(nbytes, workers):
    assert PARAMS.all_reduce_s(nbytes, workers) == PARAMS.nccl_s(nbytes, workers) > 17e-6


def test_the_gather_stays_nccl():
    assert PARAMS.gather_s(64 * KiB, 4) == PARAMS.nccl_s(32 * KiB, 4)


def test_the_fit_on_measured_kernel_times():
    """vLLM PRs #24111 and #24532 (H100, CUDA graph): one stage within 4.1% over 2 and 4 GPUs,
    two stage within 9.4%; the profiles hold the fit."""
    fits = fit_custom("h100-sxm")
    one, two = fits["one_stage"], fits["two_stage"]
    assert len(one.errors) == 7 and len(two.errors) == 6
    assert np.abs(one.errors).max() < 0.042 and np.abs(two.errors).max() < 0.095
    for profile in ("h100-sxm", "h200-sxm"):
        c = load_hardware(profile).interconnect.custom_allreduce
        for kernel, fit in ((c.one_stage, one), (c.two_stage, two)):
            assert kernel.latency == pytest.approx(fit.latency_s, abs=5e-9)
            assert kernel.bandwidth == pytest.approx(fit.bandwidth, rel=5e-4)


def test_a_70b_decode_step_at_tp_4_pays_the_custom_kernel():
    """Llama-3-70B, TP 4, 8 sequences: 161 all-reduces of 8 x 8192 x 2 B = 128 KiB, each the
    one-stage kernel, and the logits' NCCL gather."""
    cost = cost_model_for(config(4))
    params = cost.comm.params
    c = params.custom.one_stage
    step = cost.step(np.ones(8), np.full(8, 1000), sampled=8)
    gather = params.nccl_s(8 * 128256 * 2 / 2, 4)
    assert step.comm_s == pytest.approx(161 * (c.latency + 3 * 131072 / c.bandwidth) + gather)


def test_a_gpu_count_vllm_does_not_run_it_on_is_refused():
    with pytest.raises(ConfigError, match=r"custom_allreduce\.max_bytes"):
        config(4, "hardware.interconnect.custom_allreduce.max_bytes={3: 1MiB}")
