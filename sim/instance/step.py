"""The time a step takes once its batch is priced: compute, and the fetch it overlaps."""

from __future__ import annotations

from collections.abc import Generator

import simpy

from sim.cost.roofline import CostParams, StepCost
from sim.kv.modes import StepIO
from sim.memory.links import Link


def layerwise_step_s(transfer_s: float, layer_compute_s: float, layers: int) -> float:
    """A step whose KV streams in layer by layer while earlier layers compute."""
    x = transfer_s / layers
    return x + (layers - 1) * max(x, layer_compute_s) + layer_compute_s


def compute_s(cost: StepCost, io: StepIO, params: CostParams) -> float:
    """The step's compute: the cost model's price, plus decompressing what it fetched."""
    decompress = io.decompress_bytes + io.fetch_bytes * (io.decompress_bytes > 0)
    return cost.total_s + decompress / params.memory_bandwidth


def compute_with_fetch(
    env: simpy.Environment, h2d: Link, io: StepIO, compute: float, overhead: float,
    layers: int, layerwise: bool, layer_events: bool,
) -> Generator[simpy.Event, object, None]:  # fmt: skip
    """Wait out a step's compute and its critical-path fetch over ``h2d``: one after the
    other, overlapped layer by layer (closed form), or layer by layer as events."""
    if io.fetch_bytes <= 0:
        yield env.timeout(compute)
        return
    per_layer = (compute - overhead) / layers
    if layer_events:
        yield from _layer_by_layer(env, h2d, io, per_layer, layers)
        yield env.timeout(overhead)
    elif layerwise:
        t0 = env.now
        yield h2d.transfer(io.fetch_bytes, io.fetch_chunk, latencies=layers)
        fetched = env.now - t0
        total = layerwise_step_s(fetched, per_layer, layers) + overhead
        yield env.timeout(max(total - fetched, 0.0))
    else:
        yield h2d.transfer(io.fetch_bytes, io.fetch_chunk)
        yield env.timeout(compute)


def _layer_by_layer(
    env: simpy.Environment, h2d: Link, io: StepIO, per_layer: float, layers: int
) -> Generator[simpy.Event, object, None]:
    """Per-layer events: layer i's KV copy, then its compute once the previous layer ended."""
    arrived = [env.event() for _ in range(layers)]

    def copies():
        for event in arrived:
            yield h2d.transfer(io.fetch_bytes / layers, io.fetch_chunk)
            event.succeed()

    env.process(copies())
    for event in arrived:
        yield event
        yield env.timeout(per_layer)
