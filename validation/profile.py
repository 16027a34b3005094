"""Write a calibrated hardware profile: the base profile's text with a fitted efficiency section.

The base profile's other sections are kept verbatim, with their source comments; a header
block records the provenance of the fit and its residuals. Rewriting a file that already
holds a calibration header replaces that block, so a bundled profile can be refreshed in
place.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

from sim.config.hardware import Efficiency, HardwareSpec, Kernel
from sim.config.loader import validate
from sim.errors import KvsimError

BEGIN = "# --- calibration (written by kvsim calibrate; edit the fit, not these lines) ---"
END = "# --- end of calibration header ---"
KEY_WIDTH = 26


def fmt_seconds(value: float) -> str:
    """``5.62us``-style duration with 4 significant digits."""
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6), ("ns", 1e-9)):
        if value >= scale:
            return f"{value / scale:.4g}{unit}"
    return "0us"


def fmt_bandwidth(value: float) -> str:
    """``24.4GB/s``-style bandwidth with 4 significant digits."""
    return f"{value / 1e9:.4g}GB/s"


def fmt_pct(value: float) -> str:
    """A share as a percentage with one decimal (0.123 -> '12.3%')."""
    return f"{100 * value:.1f}%"


def fmt_number(value: float) -> str:
    """A plain number with 4 significant digits."""
    return f"{value:.4g}"


def _line(key: str, value: str, comment: str, indent: int = 2) -> str:
    text = f"{' ' * indent}{key}: {value}"
    return f"{text:<{KEY_WIDTH}} # {comment}" if comment else text


def _kernel_flow(kernel: Kernel) -> str:
    parts = [f"latency: {fmt_seconds(kernel.latency)}", f"memory: {fmt_number(kernel.memory)}"]
    if kernel.row_bandwidth is not None:
        parts.append(f"row_bandwidth: {fmt_bandwidth(kernel.row_bandwidth)}")
    if kernel.blend is not None:
        parts.append(f"blend: {fmt_number(kernel.blend)}")
    return "{" + ", ".join(parts) + "}"


SECONDS_KEYS = ("gemm_latency", "attention_latency", "decode_attention_latency", "step_overhead",
                "sequence_overhead", "async_step_gap", "layer_overhead", "moe_latency",
                "moe_row_time")  # fmt: skip
NULLABLE_KEYS = ("gemm_row_block", "gemm_max_passes")  # null: one pass over the weights
# left out of a profile at these values
UNSET = {"gemm_memory": None, "moe_gemm": 1.0, "moe_gemm_memory": 1.0, "moe_latency": 0.0,
         "moe_row_time": 0.0}  # fmt: skip
ORDER = ("gemm", "gemm_memory", "gemm_latency", "gemm_blend", "gemm_row_block", "gemm_max_passes",
         "attention", "attention_extra_keys",
         "decode_attention", "decode_attention_latency", "attention_latency", "moe_gemm",
         "moe_gemm_memory", "moe_row_time", "moe_latency", "hbm",
         "step_overhead", "sequence_overhead", "async_step_gap", "layer_overhead")  # fmt: skip


def _value(eff: Efficiency, key: str) -> str:
    value = getattr(eff, key)
    if key in NULLABLE_KEYS and value is None:
        return "null"
    if key in SECONDS_KEYS:
        return fmt_seconds(value)
    return fmt_number(float("inf") if value is None else value)


def efficiency_text(eff: Efficiency, base_lines: dict[str, str], notes: dict[str, str]) -> str:
    """The ``efficiency:`` section: keys with a note are rendered, the others kept verbatim."""
    lines = ["efficiency:"]
    for key in ORDER:
        if key in notes:
            lines.append(_line(key, _value(eff, key), notes[key]))
        elif key in base_lines:
            lines.append(base_lines[key])
        elif key in UNSET and getattr(eff, key) == UNSET[key]:
            continue
        elif getattr(eff, key) not in (None, 0.0):
            lines.append(_line(key, _value(eff, key), "kept from the base profile"))
    if eff.kernels is not None:
        lines.append(
            _line("kernels", "", notes.get("kernels", "")).replace("kernels: ", "kernels:", 1)
        )
        for kind, kernel in eff.kernels:
            if kernel is not None:
                lines.append(f"    {kind}: {_kernel_flow(kernel)}  # {notes.get(kind, 'fit')}")
    return "\n".join(lines) + "\n"


def _split_sections(text: str) -> tuple[list[str], list[str], dict[str, str], list[str]]:
    """(header comment lines, body lines before efficiency, efficiency key lines, after)."""
    lines = text.splitlines()
    if BEGIN in lines and END in lines:
        lines = lines[: lines.index(BEGIN)] + lines[lines.index(END) + 1 :]
    start = next((i for i, s in enumerate(lines) if s.startswith("efficiency:")), len(lines))
    end = next(
        (i for i in range(start + 1, len(lines)) if re.match(r"^[A-Za-z_]", lines[i])),
        len(lines),
    )
    keyed = {}
    for line in lines[start + 1 : end]:
        match = re.match(r"^  ([a-z_]+):", line)
        if match:
            keyed[match.group(1)] = line
    first = next((i for i, s in enumerate(lines) if not s.startswith("#")), 0)
    return lines[:first], lines[first:start], keyed, lines[end:]


def render_profile(
    base_text: str, name: str, eff: Efficiency, header: list[str], notes: dict[str, str],
    description: str | None = None,
) -> str:  # fmt: skip
    """The calibrated profile's YAML: base text, new name, header block, fitted efficiency."""
    comments, body, keyed, after = _split_sections(base_text)
    body = [f"name: {name}" if line.startswith("name:") else line for line in body]
    if description is not None:
        quoted = description.replace('"', "'")
        body = [f'description: "{quoted}"' if s.startswith("description:") else s for s in body]
    wrapped = [w for line in header for w in textwrap.wrap(line, 96, subsequent_indent="    ")]
    block = [BEGIN, *(f"# {line}" for line in wrapped), END]
    parts = ["\n".join([*comments, *block, *body]).rstrip() + "\n"]
    parts.append(efficiency_text(eff, keyed, notes))
    if after:
        parts.append("\n".join(after) + "\n")
    return "".join(parts)


def write_profile(path: str | Path, text: str) -> HardwareSpec:
    """Check that ``text`` is a valid hardware profile, then write it to ``path``."""
    import yaml

    spec = validate(HardwareSpec, yaml.safe_load(text), str(path))
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    except OSError as exc:
        raise KvsimError(f"{path}: cannot write the calibrated profile: {exc.strerror}") from None
    return spec


def set_value(text: str, section: str, key: str, value: str, comment: str) -> str:
    """``section.key: value  # comment`` in a profile's text (added at the section's end if new)."""
    lines = text.splitlines()
    start = next((i for i, s in enumerate(lines) if s.startswith(f"{section}:")), None)
    if start is None:
        raise KvsimError(f"the base profile has no '{section}:' section to calibrate")
    end = next(
        (i for i in range(start + 1, len(lines)) if re.match(r"^[A-Za-z_#]", lines[i])),
        len(lines),
    )
    new = _line(key, value, comment)
    for i in range(start + 1, end):
        if re.match(rf"^  {key}:", lines[i]):
            lines[i] = new
            break
    else:
        last = max(i for i in range(start, end) if lines[i].strip())
        lines.insert(last + 1, new)
    return "\n".join(lines) + "\n"
