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
        settle={"a": 0.6},
    )
    assert set(out) == {"a", "b", "c"} and all(t.runs == 6 for t in out.values())
    names = [name for name, _ in calls]
    assert names[:6] == ["a", "a", "b", "b", "c", "c"]  # the warm-up: two calls each
    assert names[6::2] == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]  # timed blocks rotate every round
    # Wall-clock gaps on a shared machine: the wait is 0.6 s, a stall long enough to pass for it is not.
    for i in range(1, len(calls)):
        gap = calls[i][1] - calls[i - 1][1]
        if names[i - 1] == "a" and names[i] != "a":  # a's warm-up or block just ended
            assert gap >= 0.6, f"no wait after a (call {i})"
        else:
            assert gap < 0.3, f"a wait where none was asked (call {i}: after {names[i - 1]})"


def test_reports_name_the_first_cpus_model_and_vector_width(tmp_path):
    from bench._timing import _cpu

    def info(name: str, flags: str) -> str:
        block = f"processor\t: 0\nvendor_id\t: X\ncpu family\t: 25\nmodel\t\t: 1\nmodel name\t: {name}\nflags\t\t: {flags}\n"
        path = tmp_path / name.replace(" ", "_")
        path.write_text(block + "\n" + block.replace("processor\t: 0", "processor\t: 1").replace(name, "other"))
        return str(path)

    assert _cpu(info("AMD EPYC", "fpu sse2 avx avx2 fma")) == "AMD EPYC (family 25, model 1; AVX2, no AVX-512)"
    assert _cpu(info("Intel Xeon", "avx2 avx512f avx512bw")) == "Intel Xeon (family 25, model 1; AVX-512)"
    assert _cpu(info("Old", "sse2 avx")) == "Old (family 25, model 1; no AVX2)"
    assert _cpu(str(tmp_path / "missing")) is None
    (tmp_path / "bare").write_text("processor\t: 0\nflags\t: avx2\n")
    assert _cpu(str(tmp_path / "bare")) is None  # no model name (some ARM kernels): left out of the report


def test_a_short_call_is_timed_in_blocks_that_last_min_block_s():
    calls = {"fast": 0, "slow": 0}

    def fast():
        calls["fast"] += 1

    def slow():
        calls["slow"] += 1
        time.sleep(0.003)

    out = interleaved(
        {"fast": fast, "slow": slow}, budget_s=0.0, max_rounds=2, block=3, pause=0.0, min_block_s=0.002, max_block=50
    )
    assert out["fast"].runs == 2 * 50  # capped at max_block: a no-op call is far shorter than 2 ms / 50
    assert out["slow"].runs == 2 * 3  # already longer than min_block_s: blocks of ``block``
    assert calls["fast"] == 4 + 2 * 50 and calls["slow"] == 2 + 2 * 3  # warm-up: 2 calls, 4 where it was sized
