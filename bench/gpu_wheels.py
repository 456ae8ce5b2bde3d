"""``make gpu-wheels``: download the wheels the device machine lacks, for ``make gpu-proof`` there.

    python -m bench.gpu_wheels [--dest .whl]

The device machine (Python 3.12, x86-64, no internet) already has NumPy, SciPy, Numba,
CuPy (CUDA 13), PyTorch, httpx, prometheus-client, uvloop, pytest and hypothesis, but not
FastAPI, uvicorn, pydantic-settings, orjson or tritonclient. This resolves the service's
and the proof's needs for that interpreter and platform (``pip download``, pinned by
``deploy/constraints.txt`` where it pins them), then keeps only the wheels of packages the
device does not have, so that nothing it has is shadowed and the folder stays small
(it travels with the checkout: 64 MiB at most). ``make gpu-proof`` installs them into a
private folder before it starts.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# nvmath-python (solve_refined's cuSOLVER IRS) without its cu13 extra: the device has CUDA 13's
# libraries already (cuda-toolkit, nvidia-cusolver), and the extra would add cuTENSOR and cuDSS
# wheels far beyond the 64 MiB the checkout may carry.
NEEDS = [
    "fastapi", "uvicorn[standard]", "pydantic", "pydantic-settings", "orjson", "tritonclient[http]", "nvmath-python",
]  # fmt: skip
PLATFORMS = [f"manylinux_2_{n}_x86_64" for n in (17, 24, 27, 28, 31, 34, 35)] + ["manylinux2014_x86_64"]
# What the device machines' image holds (KINDS.md of the device tool, read 2026-11-17).
DEVICE_HAS = """absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build
certifi charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core
cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock
flatbuffers flax fonttools formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx
huggingface-hub humanize hypothesis idna imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin
jaxlib jaxtyping jinja2 joblib kiwisolver lazy-loader lightning lightning-utilities linear-operator lineax
llvmlite lxml markdown markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack
multidict multipledispatch mypy-extensions nanobind narwhals networkx ninja numba numba-cuda numpy numpyro
nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft
nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13 nvidia-ml-py
nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime onnxscript
opencv-python-headless optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec
patsy peft pillow pip pluggy portalocker prometheus-client propcache protobuf psutil pyarrow pybind11
py-cpuinfo pygments pyparsing pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock
pytest-timeout pytest-xdist python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu
safetensors scikit-build-core scikit-image scikit-learn scipy seaborn sentencepiece sentence-transformers
setuptools shellingham simplejson six sortedcontainers statsmodels sympy tabulate tensorboard
tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm tokenizers toolz torch torchaudio
torchdiffeq torch-geometric torchmetrics torchvision tqdm transformers treescope triton typer
typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel wrapt xarray xxhash yarl
zipp""".split()  # noqa: SIM905 (the list as KINDS.md writes it)


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def wheel_project(path: Path) -> str:
    return normalize(path.name.split("-", 1)[0])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.gpu_wheels", description=__doc__.splitlines()[0])
    ap.add_argument("--dest", default=str(ROOT / ".whl"), help="folder for the wheels (ignored by git)")
    ap.add_argument("--python-version", default="3.12")
    args = ap.parse_args(argv)
    dest = Path(args.dest)
    has = {normalize(n) for n in DEVICE_HAS}
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [
            sys.executable, "-m", "pip", "download", "--quiet", "--only-binary=:all:",
            "--python-version", args.python_version, "--implementation", "cp",
            *[arg for p in PLATFORMS for arg in ("--platform", p)], "--platform", "any",
            "--constraint", str(ROOT / "deploy" / "constraints.txt"), "--dest", tmp, *NEEDS,
        ]  # fmt: skip
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            print(done.stdout + done.stderr, file=sys.stderr)
            return done.returncode
        dest.mkdir(parents=True, exist_ok=True)
        for old in dest.glob("*.whl"):
            old.unlink()  # one version of each: two would stop the install
        kept = []
        for wheel in sorted(Path(tmp).glob("*.whl")):
            if wheel_project(wheel) not in has:
                shutil.copy2(wheel, dest / wheel.name)
                kept.append(wheel)
    total = sum((dest / w.name).stat().st_size for w in kept)
    print("\n".join(w.name for w in kept))
    print(f"{len(kept)} wheels, {total / 2**20:.1f} MiB in {dest}", file=sys.stderr)
    return 0 if total < 64 << 20 else 1


if __name__ == "__main__":
    sys.exit(main())
