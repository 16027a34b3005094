"""The registry: names, parameters, context arguments, user policies by dotted path."""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import pytest

from policies import AccessTrace, EvictionPolicy, make_admission, make_eviction, replay
from policies.registry import ADMISSION, EVICTION, check_spec, register


def test_every_default_parameter_passes_its_own_check():
    for table in (EVICTION, ADMISSION):
        for name, cls in table.items():
            for key, param in cls.params.items():
                assert param.default is None or param.check(param.default), (name, key)


def test_unknown_name_suggests_and_lists_the_known_ones():
    with pytest.raises(ValueError, match="unknown eviction policy 'lruu'") as info:
        make_eviction("lruu")
    message = str(info.value)
    assert "did you mean 'lru'?" in message
    assert "s3fifo" in message and "sieve" in message and "package.module:Class" in message


def test_aliases_resolve():
    assert type(make_eviction("belady", future=np.array([1, 2]))).__name__ == "OPT"


@pytest.mark.parametrize(
    ("spec", "pattern"),
    [
        ({"name": "s3fifo", "small_fraction": 1.5}, r"'s3fifo': parameter 'small_fraction' = 1.5 "
         r"is invalid; expected a number in \(0, 1\)"),
        ({"name": "s3fifo", "move_threshold": 0}, r"'move_threshold' = 0 .*an integer >= 1"),
        ({"name": "heat", "half_life": True}, r"'half_life' = True .*a number > 0"),
        ({"name": "lfu", "aging": "yes"}, r"'aging' = 'yes' .*true or false"),
        ({"name": "s3fifo", "small_frac": 0.2}, r"unknown parameter 'small_frac' \(did you mean "
         r"'small_fraction'\?\); known parameters: ghost_fraction, move_threshold, small_fraction"),
        ({"name": "lru", "size": 3}, r"'lru': unknown parameter 'size'; known parameters: none"),
        ({"nme": "lru"}, r"a policy spec is a name or a mapping with a 'name' key"),
        (3, r"a policy spec is a name"),
    ],
)  # fmt: skip
def test_bad_parameters_name_policy_parameter_value_and_expectation(spec, pattern):
    with pytest.raises(ValueError, match=pattern):
        make_eviction(spec, capacity=10)
    with pytest.raises(ValueError, match=pattern):
        check_spec(spec)


def test_missing_context_is_named():
    with pytest.raises(ValueError, match=r"'arc' needs capacity \(the pool size in keys\)"):
        make_eviction("arc")
    with pytest.raises(ValueError, match=r"'opt' needs future .*offline"):
        make_eviction("opt", capacity=3)
    with pytest.raises(TypeError, match="unknown context argument"):
        make_eviction("lru", capcity=3)


def test_nested_base_policy_is_validated():
    check_spec({"name": "scheduler_aware", "base": {"name": "s3fifo", "small_fraction": 0.2}})
    with pytest.raises(ValueError, match="unknown eviction policy 'lur'"):
        check_spec({"name": "scheduler_aware", "base": "lur"})
    policy = make_eviction({"name": "scheduler_aware", "base": "arc"}, capacity=4)
    assert type(policy.base).__name__ == "ARC"


USER_MODULE = '''
    """A user policy: evict the largest key first."""
    from policies import EvictionPolicy
    from policies.base import param_table, positive_int


    class LargestFirst(EvictionPolicy):
        """Victims: the largest resident keys (ties impossible)."""

        name = "largest_first"
        params = param_table(stride=positive_int(1))

        def __init__(self, stride=1, capacity=None):
            self.keys, self.stride, self.capacity_seen = set(), stride, capacity

        def on_insert(self, key, now=0.0):
            self.keys.add(key)

        def on_access(self, key, now=0.0):
            pass

        def on_remove(self, key):
            self.keys.remove(key)

        def victims(self, n, pinned=None):
            free = [k for k in self.keys if pinned is None or k >= len(pinned) or not pinned[k]]
            return sorted(free, reverse=True)[: max(n, 0)]


    NotAPolicy = dict
'''


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    (tmp_path / "kvsim_user_policies.py").write_text(textwrap.dedent(USER_MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    return "kvsim_user_policies"


def test_user_policy_by_dotted_path(user_module):
    spec = {"name": f"{user_module}:LargestFirst", "stride": 2}
    policy = make_eviction(spec, capacity=2)
    assert isinstance(policy, EvictionPolicy)
    assert (policy.stride, policy.capacity_seen) == (2, 2)
    trace = AccessTrace.from_requests([[1, 5, 3, 1, 5]])
    # 3 evicts 5 (largest), 1 hits, 5 evicts 3.
    assert replay(make_eviction(f"{user_module}:LargestFirst"), trace, 2).tolist() == [
        False, False, False, True, False,
    ]  # fmt: skip
    with pytest.raises(ValueError, match=r"'stride' = 0 is invalid; expected an integer >= 1"):
        make_eviction({"name": f"{user_module}:LargestFirst", "stride": 0})


def test_dotted_path_errors_are_clear(user_module):
    with pytest.raises(ValueError, match=r"cannot import 'no_such_module_xyz': No module named"):
        make_eviction("no_such_module_xyz:Policy")
    with pytest.raises(ValueError, match=r"has no attribute 'Missing'"):
        make_eviction(f"{user_module}:Missing")
    with pytest.raises(ValueError, match=r"NotAPolicy is not a subclass of EvictionPolicy"):
        make_eviction(f"{user_module}:NotAPolicy")


def test_register_by_name_refuses_duplicates(user_module):
    import kvsim_user_policies

    cls = kvsim_user_policies.LargestFirst
    try:
        register(cls)
        assert type(make_eviction("largest_first")) is cls
        with pytest.raises(ValueError, match="name 'largest_first' is empty or taken"):
            register(cls)
    finally:
        EVICTION.pop("largest_first", None)


def test_admission_policies():
    assert make_admission("always").admit(7)
    second = make_admission({"name": "second_hit", "ghost_size": 2})
    assert [second.admit(k) for k in [1, 2, 1, 3, 4, 2]] == [False] * 2 + [True] + [False] * 3
    assert make_admission("second_hit", capacity=5).ghost_size == 5
    with pytest.raises(ValueError, match="needs ghost_size or capacity"):
        make_admission("second_hit")
    cost = np.array([0.5, 2.0])
    threshold = make_admission({"name": "threshold", "min_cost": 1.0}, cost=cost)
    assert [threshold.admit(0), threshold.admit(1)] == [False, True]
    with pytest.raises(ValueError, match="unknown admission policy 'sometimes'"):
        make_admission("sometimes")


def test_the_documented_example_policy_works(tmp_path, monkeypatch):
    docs = (Path(__file__).resolve().parents[2] / "docs" / "policies.md").read_text()
    code = docs.split("# mypkg/mru.py\n", 1)[1].split("```", 1)[0]
    assert len(code.strip().splitlines()) < 30
    (tmp_path / "kvsim_doc_mru.py").write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    trace = AccessTrace.from_requests([[1, 2, 3, 1, 2, 3]])
    policy = make_eviction({"name": "kvsim_doc_mru:MRU", "verbose": True})
    # MRU on a cyclic scan of 3 keys with room for 2: 3 evicts 2, then 1 hits, 2 evicts 1, 3 hits
    assert replay(policy, trace, 2).tolist() == [False, False, False, True, False, True]
