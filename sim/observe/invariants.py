"""Invariants checked after every engine step (``engine.check: true``, ``kvsim run --check``).

An observer of the instance: after each step (once its timeline row is recorded), and after
each run of steps taken ahead of the clock (the state the run leaves, with its last row):

- no tier holds more blocks than its capacity, and each tier's count of residents matches
  the block table;
- HBM: weights + reserve + activations + KV (running + cached) + staging is what the
  timeline row says HBM holds, the KV parts equal the resident blocks, and the whole stays
  within the usable HBM (``gpu_memory_utilization`` x capacity);
- every block's reference count equals the number of requests holding it, a held block is
  in some tier, and no block in use is evictable in its home tier;
- a running request's blocks are in its home tier (HBM; DRAM in ``dram_centric``), a
  swapped-out request's in DRAM (and in HBM only while a request there shares them), and
  each block counts the swapped-out requests holding it;
- a block holds a prefix hash exactly while the prefix index maps that hash to it (prefix
  lookups rely on it);
- every link conserves bytes: delivered + in flight = submitted (in flight: transfers on
  the wire or paying their latency), nothing delivered twice.

At the end of the run: every request finished (all its tokens out) or was rejected with a
reason, no block is still referenced, and every link delivered all it was given.

A violation raises :class:`InvariantViolation` naming the step, the simulated time, the
rule and the state that broke it. It is a simulator bug, not a bad input.
"""

from __future__ import annotations

import itertools
from collections import Counter
from typing import TYPE_CHECKING, NoReturn

import numpy as np

from sim.errors import KvsimError
from sim.instance.instance import Instance
from sim.instance.scheduler import FINISHED, REJECTED
from sim.memory.blocks import DRAM, HBM
from sim.memory.fabric import Fabric

if TYPE_CHECKING:
    from sim.observe.metrics import Table

BYTES_TOLERANCE = 1e-9  # relative: float sums of a few large byte counts


class InvariantViolation(KvsimError):
    """The simulator's state broke an invariant (a bug; the message says where and how)."""


class Invariants:
    """The checks of one instance's run: an observer of its steps (:meth:`step_ended`), and
    of the run's end (:meth:`run_ended`, called by ``sim.run``)."""

    def __init__(self, instance: Instance, fabric: Fabric, routed: np.ndarray | None = None):
        self.instance = instance
        self.fabric = fabric
        self.routed = routed  # in a cluster: each request's instance (the router's choice)
        self.prefill_of: np.ndarray | None = None  # disaggregated: each one's prefill instance
        self.index = 0  # this instance's index in the cluster
        self.step = 0

    def fail(self, rule: str, state: str) -> NoReturn:
        """Raise a violation of ``rule`` at the current step, with the offending ``state``."""
        now = self.instance.env.now
        raise InvariantViolation(
            f"invariant violated after step {self.step} (t = {now:.6f} s): {rule}; {state}"
        )

    def step_ended(self, row: dict[str, float]) -> None:
        """Every per-step check (module docstring) on the state and the step's timeline row."""
        self.step += 1
        self.check_tiers()
        self.check_hbm(row)
        self.check_blocks()
        self.check_links(final=False)

    def steps_ended(self, rows: dict[str, float | np.ndarray], steps: int) -> None:
        """A run of steps ended: the state it leaves, checked as after its last step (a run
        writes its rows at its end; that its steps are the normal loop's, one by one, is
        tests/test_decode_runs.py's)."""
        self.step += steps - 1
        last = {k: v[-1] if isinstance(v, np.ndarray) else v for k, v in rows.items()}
        self.step_ended(last)

    def check_tiers(self) -> None:
        """No tier above capacity; residents agree with the block table."""
        kv = self.instance.kv
        n = kv.table.size
        for tier in kv.tiers:
            listed = int(kv.table.where[tier.index, :n].sum())
            if tier.resident > tier.capacity:
                self.fail(
                    f"tier {tier.name} above capacity",
                    f"{tier.resident} blocks resident, capacity {tier.capacity}",
                )
            if listed != tier.resident:
                self.fail(
                    f"tier {tier.name} miscounts its blocks",
                    f"resident counter {tier.resident}, block table {listed}",
                )

    def check_hbm(self, row: dict[str, float]) -> None:
        """HBM parts sum to its use, match the resident blocks, and fit in usable HBM."""
        instance = self.instance
        plan, hbm = instance.plan, instance.kv.tiers[HBM]
        running, cached = row["hbm_kv_running_bytes"], row["hbm_kv_cached_bytes"]
        activations = instance.cost.activation_bytes(int(row["step_tokens"]), int(row["sampled"]))
        parts = {
            "weights": row["hbm_weights_bytes"],
            "reserve": row["hbm_reserve_bytes"],
            "activations": row["hbm_activation_bytes"],
            "kv running": running,
            "kv cached": cached,
            "staging": row["hbm_staging_bytes"],
        }
        used = sum(parts.values())
        shown = ", ".join(f"{k} {v:.0f}" for k, v in parts.items())
        tol = BYTES_TOLERANCE * plan.capacity
        if abs(plan.capacity - row["hbm_free_bytes"] - used) > tol:
            self.fail("HBM parts do not sum to its use", f"{shown}; free {row['hbm_free_bytes']}")
        expected = (plan.weights, plan.runtime_reserve, activations, running + cached)
        recorded = (parts["weights"], parts["reserve"], parts["activations"], row["hbm_kv_bytes"])
        if any(abs(a - b) > tol for a, b in zip(expected, recorded, strict=True)):
            self.fail("HBM parts differ from the plan and the step", f"{shown}")
        block = hbm.block_bytes * plan.kv_share  # one GPU's part of a block (all at one GPU)
        if abs(running + cached - hbm.resident * block) > tol:
            self.fail(
                "HBM KV bytes differ from its resident blocks",
                f"running {running:.0f} + cached {cached:.0f} vs {hbm.resident} blocks of "
                f"{block:.0f} B",
            )
        if used > plan.usable + tol:
            self.fail(
                "HBM above its usable capacity",
                f"{shown}: {used:.0f} B > usable {plan.usable:.0f} B",
            )

    def check_blocks(self) -> None:
        """Reference counts match the requests holding each block; held blocks are resident."""
        kv = self.instance.kv
        t, n = kv.table, kv.table.size
        holders = np.flatnonzero(kv.held > 0).tolist()
        lists = [kv.blocks[rid] for rid in holders]
        lengths = np.fromiter(map(len, lists), dtype=np.int64, count=len(lists))
        if not np.array_equal(lengths, kv.held[holders]):
            i = int(np.flatnonzero(lengths != kv.held[holders])[0])
            self.fail(
                "a request holds another number of blocks than it counts",
                f"request #{holders[i]}: {lengths[i]} blocks, held {int(kv.held[holders[i]])}",
            )
        flat = np.fromiter(itertools.chain.from_iterable(lists), np.int64, int(lengths.sum()))
        refs = np.bincount(flat, minlength=n)
        if len(refs) > n or not np.array_equal(refs, t.ref[:n]):
            b = int(np.flatnonzero(refs[:n] != t.ref[:n])[0]) if len(refs) == n else n
            self.fail(
                "block reference counts do not match their owners",
                f"block {b}: ref {int(t.ref[b]) if b < n else '-'}, held by "
                f"{int(refs[b])} requests ({len(holders)} requests hold blocks)",
            )
        resident = t.where[:, :n].any(axis=0)
        homeless = np.flatnonzero((refs > 0) & ~resident)
        if len(homeless):
            self.fail("a block in use is in no tier", f"block {int(homeless[0])}")
        freed = np.flatnonzero((t.owner[:n] < 0) & resident)
        if len(freed):
            self.fail("a dropped block (its id free) is still in a tier", f"block {int(freed[0])}")
        self.check_places()
        self.check_index()
        for tier in kv.tiers:
            evictable = np.fromiter(tier.evictable, dtype=np.int64, count=len(tier.evictable))
            if not t.where[tier.index, evictable].all():
                self.fail(f"tier {tier.name}: an evictable block is not resident", "")
            if tier is kv.home and (t.ref[evictable] > 0).any():
                b = int(evictable[t.ref[evictable] > 0][0])
                self.fail(f"tier {tier.name}: a block in use is evictable", f"block {b}")

    def check_places(self) -> None:
        """Running requests' blocks are at home, swapped-out ones' in DRAM (and counted)."""
        kv, where = self.instance.kv, self.instance.kv.table.where
        running = self.instance.scheduler.running.tolist()
        flat = itertools.chain.from_iterable(kv.blocks[rid] for rid in running)
        if not where[kv.home.index, np.fromiter(flat, np.int64)].all():
            rid = next(r for r in running if not where[kv.home.index, kv.blocks[r]].all())
            self.fail(f"a running request's block is not in {kv.home.name}", f"request #{rid}")
        holds: dict[int, int] = {}
        for rid in kv.swapped:
            for b in kv.blocks[rid]:
                holds[b] = holds.get(b, 0) + 1
                if not where[DRAM, b]:
                    self.fail(
                        "a swapped-out request's block is not in DRAM", f"request #{rid}: block {b}"
                    )
        left = [b for b, n in holds.items() if kv.table.ref[b] == n and where[HBM, b]]
        if kv.home is kv.tiers[HBM] and left:
            self.fail("a block only swapped-out requests hold is in HBM", f"block {left[0]}")
        if holds != kv.swap.holds:
            wrong = sorted(set(holds.items()) ^ set(kv.swap.holds.items()))[0]
            self.fail(
                "swapped-out holders miscounted", f"block {wrong[0]}: {wrong[1]} on one side only"
            )

    def check_index(self) -> None:
        """The prefix index maps each hash to the one block that holds it, and back."""
        t = self.instance.kv.table
        named = np.flatnonzero(t.hash[: t.size])
        index = {int(h): b for h, b in zip(t.hash[named].tolist(), named.tolist(), strict=True)}
        if index != t.index:
            wrong = sorted(set(index.items()) ^ set(t.index.items()))[0]
            self.fail(
                "the prefix index and the blocks' hashes disagree",
                f"hash {wrong[0]} -> block {wrong[1]} on one side only",
            )

    def check_links(self, final: bool) -> None:
        """Bytes submitted = delivered + in flight (in flight: 0 at the end)."""
        for link in self.fabric.all_links():
            active = link.bytes_on_the_wire
            submitted, delivered = link.bytes_submitted, link.bytes_delivered
            tol = BYTES_TOLERANCE * max(submitted, 1.0)
            in_flight = submitted - delivered
            if in_flight < -tol or active > in_flight + tol:
                self.fail(
                    f"link {link.name} does not conserve bytes",
                    f"submitted {submitted:.0f}, delivered {delivered:.0f}, on the wire "
                    f"{active:.0f}",
                )
            if final and abs(in_flight) > tol:
                self.fail(
                    f"link {link.name} ended with bytes undelivered",
                    f"submitted {submitted:.0f}, delivered {delivered:.0f}",
                )

    def run_ended(self, requests: Table) -> None:
        """Every request finished or rejected with a reason; nothing held; links drained."""
        instance = self.instance
        s, kv = instance.scheduler, instance.kv
        here = np.ones(len(s.status), dtype=bool)
        if self.routed is not None:
            here = self.routed == self.index
            if self.prefill_of is not None:
                here |= self.prefill_of == self.index
            elsewhere = np.flatnonzero(~here & (s.status != 0))
            if len(elsewhere):
                self.fail(
                    "a request routed elsewhere ran here",
                    f"request #{int(elsewhere[0])} (routed to {int(self.routed[elsewhere[0]])})",
                )
        status = np.asarray(requests["status"])[here[np.asarray(requests["request_id"])]]
        ended = ((s.status == FINISHED) | (s.status == REJECTED)) | ~here
        if not ended.all():
            rid = int(np.flatnonzero(~ended)[0])
            self.fail(
                "a request neither finished nor was rejected",
                f"{int((~ended).sum())} such requests, first #{rid} (state {int(s.status[rid])}, "
                f"{int(s.generated[rid])} of {int(s.output[rid])} tokens out)",
            )
        rejected = np.flatnonzero(s.status == REJECTED).tolist()
        unexplained = [rid for rid in rejected if not s.reject_reason.get(rid)]
        if unexplained:
            self.fail("a request was rejected without a reason", f"requests {unexplained[:5]}")
        done = np.flatnonzero(s.status == FINISHED)
        short = done[s.generated[done] < s.output[done]]
        if len(short):
            self.fail("a request finished early", f"request #{int(short[0])}")
        held = [rid for rid, blocks in enumerate(kv.blocks) if blocks]
        if held or int(kv.table.ref[: kv.table.size].sum()):
            self.fail("blocks still referenced after the run", f"held by requests {held[:5]}")
        statuses = dict(Counter(status.tolist()).most_common())
        if statuses.get("finished", 0) != len(done) or statuses.get("rejected", 0) != len(rejected):
            self.fail("the requests table disagrees with the scheduler", f"{statuses}")
        self.check_links(final=True)
