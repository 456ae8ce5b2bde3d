"""The READMEs' examples run: every ``sh`` and ``python`` block, against a live server.

Blocks are taken from README.md and clients/README.md in order. A block preceded by
``<!-- readme-test: skip: <reason> -->`` is not run (Docker, Kubernetes, installing
into this environment; torch and jax, whose blocks tests/lu_core/test_readme_autodiff.py
runs where they are installed); every other block must exit 0. A server started as the
README starts it (``python -m service``, on a free port instead of 8000) answers
them; ``127.0.0.1:8000`` and ``localhost:8000`` in a block are rewritten to it.
Lines ``# <expected>`` right after a command in a ``sh`` block must appear in its
output, and ``curl`` fails on an HTTP error status.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.service.test_e2e import Server

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = ("README.md", "clients/README.md")
_FENCE = re.compile(r"^```([A-Za-z0-9_-]*)\s*$")
_SKIP = re.compile(r"^<!--\s*readme-test:\s*skip:\s*(.+?)\s*-->\s*$")
_DEFAULT_ADDRESS = re.compile(r"\b(?:127\.0\.0\.1|localhost):8000\b")


@dataclass(frozen=True)
class Block:
    document: str
    line: int
    language: str
    code: str
    skip: str | None

    @property
    def id(self) -> str:
        return f"{self.document}:{self.line}"


def extract_blocks(text: str, document: str) -> list[Block]:
    """Every fenced block with its language, first line number and skip reason (if any)."""
    blocks: list[Block] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        start, language = i, m.group(1)
        i += 1
        body: list[str] = []
        while i < len(lines) and not _FENCE.match(lines[i]):
            body.append(lines[i])
            i += 1
        if i == len(lines):
            raise ValueError(f"{document}:{start + 1}: unclosed code fence")
        prev = lines[start - 1] if start > 0 else ""
        skip = _SKIP.match(prev)
        blocks.append(Block(document, start + 1, language, "\n".join(body) + "\n", skip.group(1) if skip else None))
        i += 1
    return blocks


def runnable_blocks() -> list[Block]:
    out = []
    for doc in DOCUMENTS:
        out += [b for b in extract_blocks((ROOT / doc).read_text(), doc) if b.language in ("sh", "python")]
    return out


BLOCKS = runnable_blocks()


def test_the_extractor_sees_the_blocks_and_their_markers():
    text = "a\n<!-- readme-test: skip: needs Docker -->\n```sh\ndocker run x\n```\n```python\nprint(1)\n```\n```\ntree\n```\n"
    blocks = extract_blocks(text, "T.md")
    assert [(b.language, b.line, b.skip) for b in blocks] == [
        ("sh", 3, "needs Docker"),
        ("python", 6, None),
        ("", 9, None),
    ]
    assert blocks[1].code == "print(1)\n"
    with pytest.raises(ValueError, match="unclosed"):
        extract_blocks("```sh\necho\n", "T.md")


def test_only_blocks_that_need_what_ci_lacks_are_skipped():
    skipped = [b for b in BLOCKS if b.skip]
    run = [b for b in BLOCKS if not b.skip]
    assert len(run) >= 6, [b.id for b in run]
    for b in skipped:
        # torch and jax are optional: tests/lu_core/test_readme_autodiff.py runs their blocks where installed.
        assert re.search(r"docker|kubectl|make (serve|test)|pip install|^import (torch|jax)$", b.code, re.M), (
            f"{b.id} is skipped but needs nothing CI lacks"
        )


@pytest.fixture(scope="module")
def live_url() -> Iterator[str]:
    srv = Server(LU_WARMUP="true", LU_LOG_LEVEL="warning")
    try:
        srv.wait_ready()
        yield srv.url
    finally:
        srv.stop()


def _expected_outputs(code: str) -> list[str]:
    """``# text`` lines that follow a command line (not comment-only blocks of prose)."""
    expected, previous_is_command = [], False
    for line in code.splitlines():
        stripped = line.strip()
        if stripped.startswith("# ") and previous_is_command:
            expected.append(stripped[2:])
            continue
        previous_is_command = bool(stripped) and not stripped.startswith("#") and not stripped.endswith("\\")
    return expected


def run_block(language: str, code: str, live_url: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run one block's code against ``live_url`` in ``cwd``, as a reader would paste it."""
    code = _DEFAULT_ADDRESS.sub(live_url.removeprefix("http://"), code)
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONPATH": str(ROOT),
    }
    env.pop("LU_URL", None)
    env.pop("LU_API_KEY", None)
    if language == "python":
        script = cwd / "example.py"
        script.write_text(code)
        cmd = [sys.executable, str(script)]
    else:
        # curl exits non-zero on an HTTP error, so a 415 or 422 fails the example.
        prelude = 'curl() { command curl --fail-with-body --silent --show-error "$@"; echo; }\n'
        cmd = ["bash", "-euo", "pipefail", "-c", prelude + code]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("block", [pytest.param(b, id=b.id) for b in BLOCKS])
def test_readme_block_runs(block: Block, live_url: str, tmp_path: Path):
    if block.skip:
        pytest.skip(block.skip)
    done = run_block(block.language, block.code, live_url, tmp_path)
    assert done.returncode == 0, (
        f"{block.id} failed:\n{block.code}\n--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}"
    )
    if block.language == "sh":
        for expected in _expected_outputs(block.code):
            assert expected in done.stdout, f"{block.id}: {expected!r} not in the output:\n{done.stdout}"


@pytest.mark.parametrize(
    ("language", "code", "says"),
    [
        # The README's example before issue 16: no content type, so the service answers 415.
        ("sh", "curl -s localhost:8000/lu_factor -d '{\"A\": [[1, 2], [3, 4]]}'\n", "415"),
        ("sh", "lu-client solve A.npy -o X.npy\n", "missing input"),
        ("python", "import lu_client\nlu_client.LUClient('http://127.0.0.1:8000').solve([[0.0]], [1.0])\n", "singular"),
    ],
)
def test_a_broken_example_fails(language, code, says, live_url, tmp_path):
    np_save = "import numpy as np; np.save('A.npy', np.eye(2))"
    subprocess.run([sys.executable, "-c", np_save], cwd=tmp_path, check=True)
    done = run_block(language, code, live_url, tmp_path)
    assert done.returncode != 0 and says in (done.stdout + done.stderr).lower()
