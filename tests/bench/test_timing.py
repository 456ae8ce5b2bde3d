"""bench._timing.interleaved: the harness every core benchmark times with."""

from __future__ import annotations

import time

from bench._timing import interleaved


def test_rounds_rotate_and_settle_waits_after_the_named_contender_only():
    calls: list[tuple[str, float]] = []

    def contender(name: str):
        return lambda: calls.append((name, time.perf_counter()))

    out = interleaved(
        {"a": contender("a"), "b": contender("b"), "c": contender("c")},
        budget_s=0.0,
        max_rounds=3,
        block=2,
        pause=0.0,
        settle={"a": 0.2},
    )
    assert set(out) == {"a", "b", "c"} and all(t.runs == 6 for t in out.values())
    timed = calls[6:]  # after the warm-up (two calls each)
    order = [name for name, _ in timed[::2]]
    assert order == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]  # blocks rotate every round
    for i in range(1, len(timed)):
        gap = timed[i][1] - timed[i - 1][1]
        block_ends_after_a = timed[i - 1][0] == "a" and timed[i][0] != "a"
        if block_ends_after_a:
            assert gap >= 0.2, f"no wait after a's block (call {i})"
        else:
            assert gap < 0.1, f"a wait where none was asked (call {i}: after {timed[i - 1][0]})"
