"""``kv.hbm_prefix_caching: false`` (vLLM's --no-enable-prefix-caching beside a KV connector):
a finished request's blocks leave HBM at once, so the next request with its prefix loads it
from DRAM: checked against the same run with HBM caching on, and by hand."""

import numpy as np
import pytest

from sim.errors import ConfigError
from sim.run import simulate
from sim.workload.requests import Requests
from tests.conftest import make_config

BLOCKS = 200  # the shared prefix: 200 blocks of 16 tokens, 128 KiB a token (Llama-3-8B)


def twice() -> Requests:
    """The same 3,201-token prompt twice, the second long after the first has finished."""
    hashes = np.arange(BLOCKS, dtype=np.uint64) + np.uint64(7)
    return Requests(
        arrival_s=np.array([0.0, 5.0]),
        prompt_tokens=np.array([BLOCKS * 16 + 1] * 2),
        output_tokens=np.array([4, 4]),
        prefix_hashes=[hashes, hashes],
    )


def run(hbm_caching: bool):
    config = make_config(
        kv={"mode": "offload", "hbm_prefix_caching": hbm_caching},
        engine={"check": True, "max_num_seqs": 4, "max_batched_tokens": 4096},
    )
    return simulate(config, twice())


def test_the_second_request_finds_the_prefix_in_dram_not_hbm_and_pays_the_load():
    on, off = run(True), run(False)
    # each request looks up its 200 full blocks (the last token's block is computed)
    assert (on.summary["hbm_hit_rate"], on.summary["dram_hit_rate"]) == (0.5, 0.0)
    assert (off.summary["hbm_hit_rate"], off.summary["dram_hit_rate"]) == (0.0, 0.5)
    # the first request is the same run; the second loads 200 blocks over H100's 55 GB/s link
    assert off.requests.ttft_s[0] == on.requests.ttft_s[0]
    load_floor = BLOCKS * 16 * 128 * 1024 / 55e9
    assert off.requests.ttft_s[1] - on.requests.ttft_s[1] >= load_floor
    # HBM keeps no cached block between the two requests
    between = off.timeline[(off.timeline.time_s > off.requests.finish_s[0])]
    assert (between.hbm_kv_cached_bytes == 0).all()
    assert (on.timeline.hbm_kv_cached_bytes > 0).any()


@pytest.mark.parametrize(
    "kv",
    [
        {"mode": "hbm", "hbm_prefix_caching": False},
        {"mode": "offload", "prefix_caching": False, "hbm_prefix_caching": False},
        {"mode": "offload", "write_policy": "write_back", "hbm_prefix_caching": False},
    ],
)
def test_it_needs_an_offload_prefix_cache_written_through(kv):
    with pytest.raises(ConfigError, match="hbm_prefix_caching"):
        make_config(kv=kv)
