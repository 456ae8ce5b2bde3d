"""The service's settings: one class, every field an ``LU_`` environment variable.

Nothing else in the service reads the environment. Tests build their own
``Settings(...)`` and pass it to :func:`service.app.create_app`.
"""

from __future__ import annotations

import os
from typing import Annotated, Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["Settings"]

MiB = 1 << 20
KiB = 1 << 10


def memory_available() -> int:
    """Bytes of memory this process may use: its cgroup's limit when one is set, else the machine's RAM."""
    try:
        with open("/sys/fs/cgroup/memory.max") as f:  # cgroup v2 (containers, Kubernetes)
            text = f.read().strip()
        if text.isdigit():
            return min(int(text), os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (OSError, ValueError):
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (OSError, ValueError):  # pragma: no cover - not Linux
        return 8 << 30


def default_inflight_bytes() -> int:
    """Half of :func:`memory_available`: the rest is the process itself, the OS and its page cache."""
    return memory_available() // 2


class Settings(BaseSettings):
    """Every ``LU_`` setting with its default (the README's table lists the same)."""

    model_config = SettingsConfigDict(env_prefix="LU_", case_sensitive=False, extra="ignore")

    host: str = Field("127.0.0.1", description="Address uvicorn binds.")
    port: int = Field(8000, ge=0, le=65535, description="TCP port.")
    grpc_port: int = Field(
        8001, ge=0, le=65535, description="Port of the gRPC door (inference.GRPCInferenceService); 0 turns it off."
    )
    device: Literal["auto", "cpu", "gpu"] = Field(
        "auto",
        description="auto: the GPU when CuPy sees one, else the CPU (logged loudly); gpu: fail at start without one.",
    )
    gpu_id: int = Field(0, ge=0, description="CUDA device ordinal the worker owns (one process per GPU).")
    gpu_memory_bytes: int | None = Field(
        None,
        gt=0,
        description="Limit of the GPU memory pool in bytes (default: 80% of the device's memory at start); "
        "a request that cannot fit answers 503 device_out_of_memory.",
    )
    gpu_pinned_bytes: int = Field(
        2 << 30,
        ge=0,
        description="Most pinned host memory kept for upload and download buffers and page-locked receive "
        "buffers (0: pageable copies only).",
    )
    gpu_host_max_n: int = Field(
        32,
        ge=0,
        description="On a GPU, factorizations and solves of matrices up to this order (rows and columns) are "
        "computed on the host CPU, where a request costs microseconds instead of a device round trip "
        "(0: everything on the GPU).",
    )
    max_request_bytes: int = Field(
        256 * MiB,
        gt=0,
        description="Largest request body; checked from Content-Length before reading, then while streaming.",
    )
    max_elements: int = Field(
        1 << 26,
        gt=0,
        description="Most tensor elements in one request, and in one response (checked before allocating).",
    )
    max_json_bytes: int = Field(
        64 * MiB,
        gt=0,
        description="Largest JSON body, and largest JSON header of a binary request (parsed JSON takes 20-44x "
        "its text in memory; send big tensors binary).",
    )
    max_inflight_bytes: int = Field(
        default_factory=default_inflight_bytes,
        gt=0,
        description="Memory held for all requests together (bodies, decoded tensors, jobs, answers, stored "
        "factorizations); a request that would pass it is refused with 503 before its body is read. "
        "Default: half the memory of the machine or container.",
    )
    body_pool_bytes: int = Field(
        512 * MiB,
        ge=0,
        description="Most bytes of idle receive buffers kept for reuse by later request bodies (no page faults "
        "on a big body); counted in LU_MAX_INFLIGHT_BYTES and freed first when a request needs the room; 0: none.",
    )
    read_timeout_s: float = Field(
        30.0,
        gt=0,
        description="A request's headers, and its body up to LU_MIN_UPLOAD_RATE, must arrive within this many "
        "seconds, else 408 and the connection is closed.",
    )
    min_upload_rate: int = Field(
        256 * KiB,
        ge=0,
        description="Bytes per second a body must keep up once LU_READ_TIMEOUT_S has passed: a request may take "
        "LU_READ_TIMEOUT_S + its bytes / LU_MIN_UPLOAD_RATE to arrive (0: LU_READ_TIMEOUT_S in all).",
    )
    keep_alive_s: float = Field(
        5.0, gt=0, description="An idle connection (before its first request or between requests) is closed after it."
    )
    max_header_bytes: int = Field(
        64 * KiB, ge=1024, description="Largest request line plus headers; beyond it, 431 and the connection closes."
    )
    max_connections: int = Field(
        1024,
        ge=1,
        description="Most open HTTP connections; one beyond it is answered 503 too_many_connections at once "
        "and closed (gRPC's port has the same bound of its own). Each costs a few KiB idle and up to about "
        "LU_MAX_HEADER_BYTES more while its headers arrive, outside LU_MAX_INFLIGHT_BYTES.",
    )
    max_queue: int = Field(
        64, ge=1, description="Requests waiting for the device worker; beyond it, 503 with Retry-After."
    )
    max_batch: int = Field(
        64, ge=1, description="Most queued requests merged into one device call (dynamic batching; 1 turns it off)."
    )
    batch_delay_us: int = Field(
        0,
        ge=0,
        le=1_000_000,
        description="How long the worker may wait for more requests to merge; 0 merges only what is already "
        "queued and never delays a lone request.",
    )
    max_batch_elements: int = Field(
        1 << 22, gt=0, description="Most input elements in one merged call (bigger requests run alone)."
    )
    retry_after_s: int = Field(1, ge=0, description="Seconds sent in Retry-After with a 503.")
    api_key: SecretStr | None = Field(
        None, description="Comma-separated bearer tokens; when set, every endpoint but health needs one."
    )
    docs_public: bool = Field(
        False, description="Serve /docs, /redoc and /openapi.json without the API key when LU_API_KEY is set."
    )
    warmup: bool = Field(True, description="Compile and run every operation once per dtype before reporting ready.")
    log_level: Literal["debug", "info", "warning", "error"] = Field("info", description="Log threshold.")
    log_json: bool = Field(True, description="One JSON object per log line (False: plain text, for a terminal).")
    graceful_shutdown_s: float = Field(30.0, ge=0, description="How long shutdown waits for in-flight requests.")
    store_bytes: Annotated[int, Field(ge=0)] | Literal["auto"] = Field(
        "auto",
        description="Bytes of stored factorizations (LRU eviction beyond); auto: 1 GiB on the CPU, "
        "a quarter of the device's memory on a GPU, at most half of LU_MAX_INFLIGHT_BYTES; 0 stores nothing.",
    )
    store_max_entries: int = Field(
        10_000,
        ge=0,
        description="Most stored factorizations (all API keys together; LRU eviction beyond), which also bounds "
        "GET /factorizations; 0 stores nothing.",
    )
    store_ttl_s: float = Field(
        3600.0, ge=0, description="Seconds a stored factorization may stay unused before it expires; 0: never."
    )

    @field_validator("gpu_memory_bytes", "api_key", mode="before")
    @classmethod
    def _blank_is_default(cls, value: object) -> object:
        # LU_GPU_MEMORY_BYTES="" (as compose and the ConfigMap list it) means the default; so does
        # LU_API_KEY="" (compose passes "${LU_API_KEY:-}": no key on the host, no authentication).
        return None if isinstance(value, str) and not value.strip() else value

    @field_validator("api_key")
    @classmethod
    def _keys_not_blank(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and not [k for k in value.get_secret_value().split(",") if k.strip()]:
            raise ValueError("LU_API_KEY holds separators but no key; unset it to disable authentication")
        return value

    @property
    def api_keys(self) -> tuple[bytes, ...]:
        """The accepted tokens, as bytes for :func:`hmac.compare_digest`."""
        if self.api_key is None:
            return ()
        return tuple(k.strip().encode() for k in self.api_key.get_secret_value().split(",") if k.strip())
