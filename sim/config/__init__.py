"""Run configuration: schema, profiles and loading."""

from sim.config.hardware import HardwareSpec
from sim.config.kv import KvConfig
from sim.config.loader import build_config, dump_config, load_config, load_hardware, load_model
from sim.config.model import ModelSpec
from sim.config.run import EngineConfig, RunConfig

__all__ = [
    "EngineConfig",
    "HardwareSpec",
    "KvConfig",
    "ModelSpec",
    "RunConfig",
    "build_config",
    "dump_config",
    "load_config",
    "load_hardware",
    "load_model",
]
