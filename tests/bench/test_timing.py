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


def test_a_block_goes_on_until_min_block_s_has_passed_and_cold_keeps_its_first_calls():
    calls: list[tuple[str, float, float]] = []
    costs = {"noop": 0.0, "mid": 0.002, "slow": 0.025}

    def contender(name: str):
        def call():
            t = time.perf_counter()
            if costs[name]:
                time.sleep(costs[name])
            calls.append((name, t, time.perf_counter()))

        return call

    out = interleaved(
        {name: contender(name) for name in costs},
        budget_s=0.0,
        max_rounds=2,
        block=3,
        pause=0.01,
        min_block_s=0.02,
        max_block=50,
    )
    timed = calls[2 * len(costs) :]  # after the warm-up's two calls each
    blocks: list[list[tuple[str, float, float]]] = []
    for c in timed:
        if blocks and blocks[-1][0][0] == c[0]:
            blocks[-1].append(c)
        else:
            blocks.append([c])
    assert len(blocks) == 2 * len(costs)
    for b in blocks:
        name, lasted = b[0][0], b[-1][2] - b[0][1]
        if name == "noop":
            assert len(b) == 50  # max_block ends a block of calls far shorter than 20 ms / 50
        elif name == "slow":
            assert len(b) == 3  # three calls last longer than min_block_s already
        else:  # on until 20 ms have passed (counted from just before its first call), and not a call longer
            assert len(b) >= 3 and lasted >= 0.02 - 2e-4 and b[-2][2] - b[0][1] < 0.02, (len(b), lasted)
    assert {name: t.runs for name, t in out.items()} == {
        name: sum(len(b) for b in blocks if b[0][0] == name) for name in costs
    }
    # cold: the median of each block's first three calls, here the slower ones of each block
    mid = [b for b in blocks if b[0][0] == "mid"]
    firsts = sorted(c[2] - c[1] for b in mid for c in b[:3])
    assert out["mid"].cold >= firsts[0] and out["mid"].cold <= firsts[-1] * 1.01 + 1e-4
