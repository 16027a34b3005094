"""The KV modes by name (``kv.mode``): a new mode is a new module here and a line below."""

from sim.kv.modes.base import Mode, StepIO
from sim.kv.modes.dram_centric import DramCentricMode
from sim.kv.modes.hbm import HbmMode
from sim.kv.modes.offload import OffloadMode

MODES: dict[str, type[Mode]] = {
    "hbm": HbmMode,
    "offload": OffloadMode,
    "dram_centric": DramCentricMode,
}

__all__ = ["MODES", "Mode", "StepIO"]
