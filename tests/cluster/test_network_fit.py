"""The NIC model (bytes / bandwidth + latency, a fluid link) against measured cross-node
point-to-point times: Vidur's DGX A100 and H100 ``send_recv`` rows across two nodes
(../shared/calibration/measured-comm), fitted on messages of 1 MiB and more, where a KV
transfer's messages lie (a layer of a 1000-token prompt on Llama-3-8B is 4 MiB)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import simpy

from sim.memory.links import Link

REPO = Path(__file__).resolve().parents[2]
MIB = 2**20


def cross_node(hardware: str) -> pd.DataFrame:
    root = Path(os.environ.get("KVSIM_CALIBRATION", REPO.parent / "shared" / "calibration"))
    path = root / "measured-comm" / hardware / "send_recv.csv"
    if not path.is_file():
        pytest.skip(f"measured send_recv table not found at {path} (set KVSIM_CALIBRATION)")
    table = pd.read_csv(path)
    two_nodes = (table.num_workers == 2) & (table.devices_per_node == 1)
    return table[two_nodes & (table["size"] >= MIB)]


def modelled(sizes: np.ndarray, bandwidth: float, latency: float) -> np.ndarray:
    """Each size's time through a NIC :class:`Link`, one transfer at a time."""
    times = []
    for size in sizes.tolist():
        env = simpy.Environment()
        env.run(Link(env, "nic", bandwidth, latency).transfer(size))
        times.append(env.now)
    return np.array(times)


@pytest.mark.parametrize(("hardware", "low", "high"), [("h100", 25e9, 50e9), ("a100", 5e9, 25e9)])
def test_the_nic_model_fits_measured_cross_node_send_recv(hardware, low, high):
    rows = cross_node(hardware)
    sizes = rows["size"].to_numpy(dtype=float)
    measured = rows["time_stats.send_recv.median"].to_numpy() * 1e-3
    A = np.vstack([np.ones(len(sizes)), sizes]).T
    (latency, per_byte), *_ = np.linalg.lstsq(A, measured, rcond=None)
    bandwidth = 1.0 / per_byte
    assert low < bandwidth < high  # a 200-400 Gb/s NIC's effective rate (A100: less)
    error = np.abs(modelled(sizes, bandwidth, max(latency, 0.0)) - measured) / measured
    assert np.median(error) < 0.05 and np.percentile(error, 90) < 0.1
