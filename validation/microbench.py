"""Microbenchmarks on the device (``cuda`` or ``cpu``): copies, GEMMs, kernels, attention.

Every operator timed is the one the mini-engine runs (``validation.torchmodel``), at the
shapes of a model profile's layers. The result is a long table (``sim.cost.optables``
columns plus ``bytes``, ``flops``, ``batch``, ``context``, ``direction``, ``pinned``,
``time_min_s``, ``time_p10_s``, ``time_p90_s``, ``repeats``, ``dtype``, ``device``,
``torch``, ``date``).
On the CPU, copies between two host buffers stand in for host<->device copies (``direction``
is ``host``); pinned memory does not apply.
"""

from __future__ import annotations

import datetime
import platform
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch

from sim.config.model import ModelSpec
from sim.cost.optables import KERNEL_KINDS
from sim.cost.roofline import CostModel, CostParams
from validation.kvpools import KvPools
from validation.timing import Timing, measure, rotation
from validation.torchmodel import (
    TORCH_DTYPES,
    attend,
    linear,
    rms_norm,
    rope_tables,
    split_qkv,
    step_layout,
    swiglu,
)

KIB, MIB = 2**10, 2**20
MAX_POOL_BYTES = 2 * 2**30  # attention points whose KV would exceed this are skipped
_PROBE = CostParams(1.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0)  # only shapes are read from it


@dataclass(frozen=True)
class Plan:
    """Which shapes and sizes to time, and how long to spend on each point."""

    tokens: tuple[int, ...]
    copy_sizes: tuple[int, ...]
    block_counts: tuple[int, ...]
    decode_batches: tuple[int, ...]
    decode_contexts: tuple[int, ...]
    prefill_lengths: tuple[int, ...]
    repeats: int
    budget_s: float


QUICK = Plan(
    tokens=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512),
    copy_sizes=tuple(4 * KIB * 4**k for k in range(8)),  # 4 KiB .. 64 MiB
    block_counts=(1, 4, 16, 64),
    decode_batches=(1, 4, 8),
    decode_contexts=(32, 128, 512),
    prefill_lengths=(16, 64, 128, 256, 512),
    repeats=7,
    budget_s=0.3,
)
FULL = Plan(
    tokens=tuple(sorted({2**k for k in range(15)} | {3 * 2**k for k in range(4, 13)})),
    copy_sizes=tuple(4 * KIB * 2**k for k in range(19)),  # 4 KiB .. 1 GiB
    block_counts=(1, 4, 16, 64, 256),
    decode_batches=(1, 2, 4, 8, 16, 32, 64),
    decode_contexts=(512, 1024, 2048, 4096, 8192, 16384, 32768),
    prefill_lengths=(128, 256, 512, 1024, 2048, 4096, 8192, 16384),
    repeats=25,
    budget_s=2.0,
)


FULL_CPU = Plan(  # FULL scaled to what one CPU thread measures in minutes, not hours
    tokens=(1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 2048, 4096),
    copy_sizes=tuple(4 * KIB * 2**k for k in range(19)),  # 4 KiB .. 1 GiB
    block_counts=(1, 4, 16, 64, 256),
    decode_batches=(1, 2, 4, 8, 16, 32),
    decode_contexts=(32, 128, 512, 2048, 8192),
    prefill_lengths=(16, 64, 128, 256, 512, 1024, 2048, 4096),
    repeats=15,
    budget_s=1.0,
)


def plan_for(device: str, quick: bool) -> Plan:
    """QUICK anywhere; FULL on a GPU, FULL_CPU on the CPU."""
    if quick:
        return QUICK
    return FULL if device.startswith("cuda") else FULL_CPU


def device_name(device: str) -> str:
    """The accelerator's name, or the CPU model."""
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(0)
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


ROW_DEFAULTS = {
    "fan_in": 0, "fan_out": 0, "row_bytes": 0.0, "per_layer": True, "bytes": 0.0, "flops": 0.0,
    "batch": 0, "context": 0, "direction": "", "pinned": False,
}  # fmt: skip


class Bench:
    """Collects rows; one method per kind of operator."""

    def __init__(self, model: ModelSpec, device: str, plan: Plan, block_tokens: int, seed: int = 0):
        self.model, self.device, self.plan, self.bt = model, device, plan, block_tokens
        self.dtype = TORCH_DTYPES[model.dtype]
        self.gen = torch.Generator(device="cpu").manual_seed(seed)
        self.cost = CostModel(model, _PROBE)
        self.rows: list[dict] = []
        self.meta = {
            "model": model.name, "tp": 1, "dtype": model.dtype, "device": device_name(device),
            "torch": torch.__version__, "date": datetime.date.today().isoformat(),
            "source": f"kvsim microbench ({device})",
        }  # fmt: skip

    def rand(self, *shape: int) -> torch.Tensor:
        """Fresh normal random numbers on the device, never zeros."""
        return torch.randn(*shape, generator=self.gen).to(self.device, self.dtype)

    def time(self, fn: Callable[[int], object]) -> Timing:
        """Time ``fn`` with this plan's repeats and budget."""
        return measure(fn, self.device, self.plan.repeats, budget_s=self.plan.budget_s)

    def add(self, timing: Timing, **row: object) -> None:
        """One row of the long table."""
        stats = {
            "time_s": timing.median_s, "time_min_s": timing.min_s, "time_std_s": timing.std_s,
            "time_p10_s": timing.p10_s,
            "time_p90_s": timing.p90_s, "repeats": timing.repeats,
        }  # fmt: skip
        self.rows.append(ROW_DEFAULTS | self.meta | row | stats)

    def frame(self) -> pd.DataFrame:
        """Every row so far."""
        return pd.DataFrame(self.rows)


def bench_gemms(b: Bench) -> None:
    """The layer's projections and the LM head at every token count."""
    m = b.model
    names = ("qkv", "o", "up", "down")
    shapes = dict(zip(names, m.attention_gemms + m.mlp_gemms(m.intermediate), strict=True))
    shapes["lm_head"] = (m.hidden, m.vocab)
    for op, (fan_in, fan_out) in shapes.items():
        n_w = rotation(int(fan_in * fan_out * m.dtype_bytes), b.device, b.plan.repeats + 2)
        weights = [b.rand(fan_out, fan_in) for _ in range(n_w)]
        for tokens in b.plan.tokens:
            n_x = rotation(int(tokens * fan_in * m.dtype_bytes), b.device, b.plan.repeats + 2)
            xs = [b.rand(tokens, fan_in) for _ in range(n_x)]

            def gemm(i: int, xs: list = xs, ws: list = weights) -> object:
                return linear(xs[i % len(xs)], ws[i % len(ws)])

            flops = 2.0 * tokens * fan_in * fan_out
            b.add(b.time(gemm), kind="gemm", op=op, tokens=tokens, fan_in=fan_in,
                  fan_out=fan_out, per_layer=op != "lm_head", flops=flops)  # fmt: skip


def _kernel(b: Bench, kind: str, tokens: int) -> tuple[Callable[..., object], Callable[[], tuple]]:
    """The operator of a kernel kind and a maker of fresh inputs for ``tokens`` rows."""
    m = b.model
    if kind == "norm":
        weight = b.rand(m.hidden)
        return rms_norm, lambda: (b.rand(tokens, m.hidden), weight)
    if kind == "rope":
        cos, sin = rope_tables(torch.arange(tokens, device=b.device) + 7, m.head_dim)

        def rope(qkv: torch.Tensor) -> object:
            return split_qkv(qkv, m, cos, sin)

        return rope, lambda: (b.rand(tokens, m.q_dim + 2 * m.kv_dim),)
    if kind == "activation":
        return swiglu, lambda: (b.rand(tokens, 2 * m.intermediate),)
    if kind == "residual_add":
        return torch.add, lambda: (b.rand(tokens, m.hidden), b.rand(tokens, m.hidden))
    table = b.rand(m.vocab, m.hidden)

    def embed(ids: torch.Tensor) -> object:
        return table[ids]

    return embed, lambda: (torch.randint(0, m.vocab, (tokens,), generator=b.gen).to(b.device),)


def bench_kernels(b: Bench) -> None:
    """Norm, rope, activation, residual add and embedding at every token count."""
    rows = b.cost.kernel_row_bytes()
    for kind in KERNEL_KINDS:
        for tokens in b.plan.tokens:
            fn, make = _kernel(b, kind, tokens)
            count = rotation(int(tokens * rows[kind]), b.device, b.plan.repeats + 2)
            inputs = [make() for _ in range(count)]

            def run(i: int, fn: Callable = fn, inputs: list = inputs) -> object:
                return fn(*inputs[i % len(inputs)])

            b.add(b.time(run), kind=kind, op=kind, tokens=tokens, row_bytes=rows[kind],
                  per_layer=kind != "embedding", bytes=tokens * rows[kind])  # fmt: skip


def _attention_point(b: Bench, new: list[int], context: list[int]) -> Timing | None:
    """Time one layer's ``attend`` for sequences adding ``new`` after ``context``."""
    m, bt = b.model, b.bt
    blocks = [-(-(c + n) // bt) for c, n in zip(context, new, strict=True)]
    if sum(blocks) * bt * 2 * m.kv_dim * m.dtype_bytes > MAX_POOL_BYTES:
        return None
    pool = b.rand(1, 2, sum(blocks) + 1, bt, m.kv_heads, m.head_dim)
    order = (torch.randperm(sum(blocks), generator=b.gen) + 1).tolist()  # scattered blocks
    tables = [order[sum(blocks[:i]) : sum(blocks[: i + 1])] for i in range(len(blocks))]
    layout = step_layout(new, context, tables, bt, b.device)
    t = sum(new)
    inputs = [
        (b.rand(t, m.heads, m.head_dim), b.rand(t, m.kv_heads, m.head_dim),
         b.rand(t, m.kv_heads, m.head_dim))
        for _ in range(3)
    ]  # fmt: skip
    return b.time(lambda i: attend(*inputs[i % 3], pool, 0, layout))


def bench_attention(b: Bench) -> None:
    """Decode (one query per sequence, paged KV) and causal prefill, one layer each."""
    per_pair, per_token = b.cost.attention_flops_per_pair, b.cost.kv_bytes_per_token_layer
    for batch in b.plan.decode_batches:
        for ctx in b.plan.decode_contexts:
            timing = _attention_point(b, [1] * batch, [ctx] * batch)
            if timing is not None:
                keys = batch * (ctx + 1)
                b.add(timing, kind="attention_decode", op="attend", tokens=batch, batch=batch,
                      context=ctx, bytes=keys * per_token, flops=keys * per_pair)  # fmt: skip
    for n in b.plan.prefill_lengths:
        timing = _attention_point(b, [n], [0])
        if timing is not None:
            b.add(timing, kind="attention_prefill", op="attend", tokens=n, batch=1, context=0,
                  bytes=n * per_token, flops=n * (n + 1) / 2 * per_pair)  # fmt: skip


def _buffers(b: Bench, size: int, direction: str, pinned: bool) -> list[tuple[torch.Tensor, ...]]:
    """(source, destination) pairs of ``size`` bytes, enough to rotate past the caches."""
    host: dict = {"device": "cpu", "pin_memory": pinned and b.device != "cpu"}
    dev: dict = {"device": b.device}
    src_kw, dst_kw = {
        "h2d": (host, dev), "d2h": (dev, host), "host": (host, host), "d2d": (dev, dev),
    }[direction]  # fmt: skip
    pairs = []
    for _ in range(rotation(size, b.device, b.plan.repeats + 2)):
        src = torch.empty(size, dtype=torch.uint8, **src_kw)
        src.copy_(torch.randint(0, 255, (size,), dtype=torch.uint8, generator=b.gen))
        dst = torch.empty(size, dtype=torch.uint8, **dst_kw)
        dst.fill_(1)  # touch every page now: a first-touch page fault is not a copy's cost
        pairs.append((src, dst))
    return pairs


def bench_copies(b: Bench) -> None:
    """Contiguous copies of every size: H2D and D2H, pinned and pageable, and device to device
    (its traffic is the memory bandwidth); on the CPU, host to host stands in for all."""
    if b.device == "cpu":
        cases = [("host", False)]
    else:
        cases = [(d, p) for d in ("h2d", "d2h") for p in (True, False)] + [("d2d", False)]
    for direction, pinned in cases:
        for size in b.plan.copy_sizes:
            pairs = _buffers(b, size, direction, pinned)

            def copy(i: int, pairs: list = pairs) -> object:
                src, dst = pairs[i % len(pairs)]
                return dst.copy_(src, non_blocking=True)

            b.add(b.time(copy), kind="copy", op="copy", direction=direction, pinned=pinned,
                  bytes=size, tokens=0, per_layer=False)  # fmt: skip


def bench_block_copies(b: Bench) -> None:
    """Moving KV blocks host -> device: one gathered copy vs one copy per block."""
    direction = "host" if b.device == "cpu" else "h2d"
    chunk = b.bt * b.model.kv_dim * b.model.dtype_bytes  # one contiguous (layer, K|V) piece
    for count in b.plan.block_counts:
        pools = KvPools(b.model, b.bt, count + 1, 4 * count + 1, "dram_centric", b.device)
        assert pools.host is not None
        pools.host.copy_(torch.randn(pools.host.shape, generator=b.gen))
        src = torch.randperm(4 * count, generator=b.gen)[:count]
        dst = torch.arange(count)

        def gathered(
            i: int, p: KvPools = pools, s: torch.Tensor = src, d: torch.Tensor = dst
        ) -> None:
            p._copy(p.device, d, p.host, s)

        def each(i: int, p: KvPools = pools, s: torch.Tensor = src, d: torch.Tensor = dst) -> None:
            for j in range(len(s)):
                p._copy(p.device, d[j : j + 1], p.host, s[j : j + 1])

        for op, fn in (("gathered", gathered), ("each", each)):
            b.add(b.time(fn), kind="copy_blocks", op=op, direction=direction, tokens=count,
                  bytes=count * pools.block_bytes, row_bytes=chunk, per_layer=False,
                  pinned=b.device != "cpu")  # fmt: skip


BENCHES = (
    ("copies", bench_copies),
    ("block copies", bench_block_copies),
    ("GEMMs", bench_gemms),
    ("kernels", bench_kernels),
    ("attention", bench_attention),
)


def run_microbench(
    model: ModelSpec, device: str, quick: bool, block_tokens: int = 16,
    log: Callable[[str], None] = print,
) -> pd.DataFrame:  # fmt: skip
    """Every microbenchmark for ``model`` on ``device``; the long table of raw measurements."""
    b = Bench(model, device, plan_for(device, quick), block_tokens)
    with torch.inference_mode():
        for name, fn in BENCHES:
            log(f"  timing {name} ...")
            fn(b)
    return b.frame()


def save_measurements(table: pd.DataFrame, path: str | Path) -> Path:
    """Write the raw measurements (CSV)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    table.to_csv(path, index=False)
    return path
