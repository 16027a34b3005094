"""Workload schema: where requests come from (generators, trace files, fitted traces).

``workload`` is one of the kinds below (``kind:`` picks it), or a named preset: the bare
name (``workload: multi-turn-chat``) or ``{preset: NAME, ...overrides}``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, get_args

from pydantic import BeforeValidator, ConfigDict, Field, model_validator

from sim.config.base import Fraction, PerSecond, Seconds, Strict
from sim.config.presets import expand_preset
from sim.units import RATE

# --- token-count distributions ------------------------------------------------------------


class Fixed(Strict):
    """Every draw is ``value``."""

    kind: Literal["fixed"] = "fixed"
    value: int = Field(gt=0)


class Uniform(Strict):
    """Integers uniform on [min, max]."""

    kind: Literal["uniform"]
    min: int = Field(gt=0)
    max: int = Field(gt=0)

    @model_validator(mode="after")
    def _ordered(self) -> Uniform:
        if self.min > self.max:
            raise ValueError(f"min ({self.min}) must not exceed max ({self.max})")
        return self


class Clipped(Strict):
    """A continuous distribution rounded to integers and clipped to [min, max]."""

    min: int = Field(1, gt=0)
    max: int | None = Field(None, gt=0)

    @model_validator(mode="after")
    def _ordered(self) -> Clipped:
        if self.max is not None and self.min > self.max:
            raise ValueError(f"min ({self.min}) must not exceed max ({self.max})")
        return self


class Normal(Clipped):
    """Normal with ``mean`` and ``std``, rounded and clipped."""

    kind: Literal["normal"]
    mean: float = Field(gt=0)
    std: float = Field(ge=0)


class LogNormal(Clipped):
    """Log-normal whose *arithmetic* mean is ``mean`` and log-space std is ``sigma``."""

    kind: Literal["lognormal"]
    mean: float = Field(gt=0)
    sigma: float = Field(ge=0)


def _bare_int_is_fixed(value: object) -> object:
    if isinstance(value, int) and not isinstance(value, bool):
        return {"kind": "fixed", "value": value}
    return value


LengthDist = Annotated[
    Fixed | Uniform | Normal | LogNormal,
    BeforeValidator(_bare_int_is_fixed),
    Field(discriminator="kind"),
]

# --- duration distributions (think time) ---------------------------------------------------


class FixedTime(Strict):
    """Every draw is ``value`` seconds."""

    kind: Literal["fixed"] = "fixed"
    value: Seconds


class ExponentialTime(Strict):
    """Exponential durations with mean ``mean``."""

    kind: Literal["exponential"]
    mean: Seconds


class UniformTime(Strict):
    """Durations uniform on [min, max]."""

    kind: Literal["uniform"]
    min: Seconds
    max: Seconds

    @model_validator(mode="after")
    def _ordered(self) -> UniformTime:
        if self.min > self.max:
            raise ValueError(f"min ({self.min}) must not exceed max ({self.max})")
        return self


class LogNormalTime(Strict):
    """Log-normal durations with arithmetic mean ``mean`` and log-space std ``sigma``."""

    kind: Literal["lognormal"]
    mean: Seconds
    sigma: float = Field(ge=0)


def _bare_duration_is_fixed(value: object) -> object:
    if isinstance(value, int | float | str) and not isinstance(value, bool):
        return {"kind": "fixed", "value": value}
    return value


DurationDist = Annotated[
    FixedTime | ExponentialTime | UniformTime | LogNormalTime,
    BeforeValidator(_bare_duration_is_fixed),
    Field(discriminator="kind"),
]

# --- arrival processes ---------------------------------------------------------------------


class Poisson(Strict):
    """Exponential inter-arrival times at ``rate`` requests/s."""

    kind: Literal["poisson"]
    rate: PerSecond


class Gamma(Strict):
    """Gamma inter-arrival times at ``rate`` requests/s with coefficient of variation ``cv``."""

    kind: Literal["gamma"]
    rate: PerSecond
    cv: float = Field(gt=0)


class AllAtOnce(Strict):
    """Every request arrives at t = 0 (a closed batch)."""

    kind: Literal["all_at_once"]


class OnOff(Strict):
    """Bursts: Poisson at ``rate_on`` for ``on_s``, then at ``rate_off`` for ``off_s``, repeated.

    Period lengths are exponential with those means (``periods: exponential``, a Markov-
    modulated Poisson process) or exactly those lengths (``periods: fixed``).
    """

    kind: Literal["on_off"]
    rate_on: PerSecond
    rate_off: Annotated[float, BeforeValidator(RATE.parse), Field(ge=0)] = 0.0
    on_s: Annotated[Seconds, Field(gt=0)]
    off_s: Annotated[Seconds, Field(gt=0)]
    periods: Literal["exponential", "fixed"] = "exponential"


Arrival = Annotated[Poisson | Gamma | AllAtOnce | OnOff, Field(discriminator="kind")]


class Empirical(Strict):
    """Inter-arrival times resampled from the source trace's own gaps."""

    kind: Literal["empirical"] = "empirical"


FittedArrival = Annotated[
    Empirical | Poisson | Gamma | AllAtOnce | OnOff, Field(discriminator="kind")
]

# --- generators ----------------------------------------------------------------------------


class Client(Strict):
    """How the requests are sent. ``max_concurrency``: a closed-loop client of that many slots
    (vLLM's ``benchmark_serving --max-concurrency``): a request is sent at its arrival time or
    when one in flight finishes, whichever is later, and its latencies count from then."""

    max_concurrency: int | None = Field(
        None,
        gt=0,
        description="a closed-loop client of this many slots: a request is sent at its arrival "
        "or when one in flight finishes or is rejected, whichever is later; its latencies count "
        "from then (vLLM's `--max-concurrency`); null = open loop",
    )


class SyntheticWorkload(Client):
    """Independent requests with drawn arrivals and lengths.

    ``shared_prefix_tokens > 0`` makes the first that many tokens of every prompt identical
    (a shared system prompt inside the drawn prompt length) and gives requests prefix hashes.
    """

    kind: Literal["synthetic"]
    num_requests: int = Field(gt=0)
    arrival: Arrival
    prompt_tokens: LengthDist
    output_tokens: LengthDist
    shared_prefix_tokens: int = Field(0, ge=0)


class MultiTurnWorkload(Client):
    """Chat sessions: each turn's prompt is the whole history plus the new user message.

    Sessions arrive by ``session_arrival``; a session has ``turns`` turns; turn n+1 arrives
    ``think_time`` after turn n arrived. Every session starts with one of ``system_prompts``
    shared system prompts of ``system_prompt_tokens`` tokens. A session ends early before a
    turn whose prompt + output would exceed ``max_context_tokens``.
    """

    kind: Literal["multi_turn"]
    num_sessions: int = Field(gt=0)
    session_arrival: Arrival
    turns: LengthDist
    think_time: DurationDist
    user_tokens: LengthDist
    output_tokens: LengthDist
    system_prompt_tokens: int = Field(0, ge=0)
    system_prompts: int = Field(1, gt=0)
    max_context_tokens: int | None = Field(None, gt=0)


class DocumentsWorkload(Client):
    """Questions on shared documents (RAG, long-document QA): prompt = system + doc + question.

    Each request picks one of ``num_documents`` documents, Zipf-distributed with exponent
    ``zipf_s`` (0: uniform; document 0 is the most popular).
    """

    kind: Literal["documents"]
    num_requests: int = Field(gt=0)
    arrival: Arrival
    num_documents: int = Field(gt=0)
    document_tokens: LengthDist
    question_tokens: LengthDist
    output_tokens: LengthDist
    zipf_s: float = Field(1.0, ge=0)
    system_prompt_tokens: int = Field(0, ge=0)


class SharedContextWorkload(Client):
    """Multi-tenant queries on shared contexts: prompt = customer's context + user's session.

    Each of ``customers`` customers has one long context (a document or system prompt) that
    every query of its ``users_per_customer`` users starts with. Requests arrive by
    ``arrival``; each picks a customer, Zipf-distributed with exponent ``zipf_s`` (0:
    uniform; customer 0 is the most popular), and one of its users uniformly. A user's
    requests form sessions of ``turns`` turns: a later turn's prompt carries the session's
    earlier queries and answers after the context (1, the default: every query is new).
    """

    kind: Literal["shared_context"]
    num_requests: int = Field(gt=0)
    arrival: Arrival
    customers: int = Field(gt=0)
    users_per_customer: int = Field(gt=0)
    context_tokens: LengthDist
    query_tokens: LengthDist
    output_tokens: LengthDist
    turns: LengthDist = Field(1, validate_default=True)
    zipf_s: float = Field(1.0, ge=0)


# --- traces --------------------------------------------------------------------------------

TraceFormat = Literal["mooncake", "azure", "burstgpt", "csv", "jsonl"]
TimeUnit = Literal["s", "ms", "us", "ns", "min", "h", "datetime"]
TRACE_FORMATS: tuple[str, ...] = get_args(TraceFormat)
TIME_UNITS: tuple[str, ...] = get_args(TimeUnit)

FilterValue = str | int | float | bool
_Window = tuple[Seconds, Seconds]


class TraceColumns(Strict):
    """Which column of a csv/jsonl file holds each field."""

    arrival: str
    prompt_tokens: str
    output_tokens: str
    session: str | None = None
    hash_ids: str | None = None


class Sample(Strict):
    """Keep each row with probability ``fraction`` (seeded by ``seed``, else the run seed)."""

    fraction: Fraction
    seed: int | None = Field(None, ge=0)


class TraceSource(Strict):
    """A trace file and how to read and select its rows (see docs/workloads.md)."""

    format: TraceFormat
    path: str = Field(min_length=1)
    columns: TraceColumns | None = None
    time_unit: TimeUnit | None = None
    hash_block_tokens: int | None = Field(None, gt=0)
    time_window: _Window | None = None
    max_requests: int | None = Field(None, gt=0)
    rate_scale: float = Field(1.0, gt=0)
    jitter_s: Seconds = 0.0
    filter: dict[str, FilterValue | list[FilterValue]] | None = None
    sample: Sample | None = None
    on_bad_rows: Literal["error", "skip"] = "error"
    on_unsorted: Literal["error", "sort"] = "error"

    @model_validator(mode="after")
    def _consistent(self) -> TraceSource:
        generic = self.format in ("csv", "jsonl")
        if generic and self.columns is None:
            raise ValueError(
                f"format {self.format!r} needs 'columns' (arrival, prompt_tokens, output_tokens)"
            )
        if not generic:
            for key in ("columns", "time_unit", "hash_block_tokens"):
                if getattr(self, key) is not None:
                    raise ValueError(f"'{key}' is only for formats csv and jsonl")
        hashes = self.columns is not None and self.columns.hash_ids is not None
        if hashes and self.format != "jsonl":
            raise ValueError("columns.hash_ids needs format jsonl (a list per row)")
        if hashes != (self.hash_block_tokens is not None):
            raise ValueError("columns.hash_ids and hash_block_tokens go together")
        if self.time_window is not None and self.time_window[0] >= self.time_window[1]:
            raise ValueError(f"time_window {list(self.time_window)} must have start < end")
        return self


class TraceWorkload(TraceSource, Client):
    """Replay a trace file's requests."""

    kind: Literal["trace"]


class FittedWorkload(Client):
    """Requests drawn from a trace's empirical distributions (``from:`` a trace source).

    (prompt, output) pairs are resampled jointly from the trace's rows; arrivals resample the
    trace's inter-arrival gaps (``arrival: empirical``) or follow any arrival process.
    ``max_total_tokens`` shrinks prompt and output proportionally so their sum fits.
    """

    model_config = ConfigDict(populate_by_name=True, serialize_by_alias=True)

    kind: Literal["fitted"]
    source: TraceSource = Field(alias="from")
    num_requests: int | None = Field(None, gt=0)
    arrival: FittedArrival = Empirical()
    max_total_tokens: int | None = Field(None, ge=2)


def _expand_preset(value: Any) -> Any:
    """A preset name or ``{preset: NAME, ...}`` becomes the preset's full mapping."""
    if isinstance(value, str) or (isinstance(value, dict) and "preset" in value):
        return expand_preset(value)
    return value


_AnyWorkload = Annotated[
    SyntheticWorkload
    | MultiTurnWorkload
    | DocumentsWorkload
    | SharedContextWorkload
    | TraceWorkload
    | FittedWorkload,
    Field(discriminator="kind"),
]
WorkloadConfig = Annotated[_AnyWorkload, BeforeValidator(_expand_preset)]
