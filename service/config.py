"""The service's settings: one class, every field an ``LU_`` environment variable.

Nothing else in the service reads the environment. Tests build their own
``Settings(...)`` and pass it to :func:`service.app.create_app`.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["Settings"]

MiB = 1 << 20


class Settings(BaseSettings):
    """Every ``LU_`` setting with its default (the README's table lists the same)."""

    model_config = SettingsConfigDict(env_prefix="LU_", case_sensitive=False, extra="ignore")

    host: str = Field("127.0.0.1", description="Address uvicorn binds.")
    port: int = Field(8000, ge=0, le=65535, description="TCP port.")
    device: Literal["auto", "cpu", "gpu"] = Field(
        "auto",
        description="auto: the GPU when CuPy sees one, else the CPU (logged loudly); gpu: fail at start without one.",
    )
    gpu_id: int = Field(0, ge=0, description="CUDA device ordinal the worker owns (one process per GPU).")
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
    max_queue: int = Field(
        64, ge=1, description="Requests waiting for the device worker; beyond it, 503 with Retry-After."
    )
    retry_after_s: int = Field(1, ge=0, description="Seconds sent in Retry-After with a 503.")
    api_key: SecretStr | None = Field(
        None, description="Comma-separated bearer tokens; when set, every endpoint but health needs one."
    )
    warmup: bool = Field(True, description="Compile and run every operation once per dtype before reporting ready.")
    log_level: Literal["debug", "info", "warning", "error"] = Field("info", description="Log threshold.")
    log_json: bool = Field(True, description="One JSON object per log line (False: plain text, for a terminal).")
    graceful_shutdown_s: float = Field(30.0, ge=0, description="How long shutdown waits for in-flight requests.")

    @field_validator("api_key")
    @classmethod
    def _keys_not_blank(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and not [k for k in value.get_secret_value().split(",") if k.strip()]:
            raise ValueError("LU_API_KEY is set but holds no key; unset it to disable authentication")
        return value

    @property
    def api_keys(self) -> tuple[bytes, ...]:
        """The accepted tokens, as bytes for :func:`hmac.compare_digest`."""
        if self.api_key is None:
            return ()
        return tuple(k.strip().encode() for k in self.api_key.get_secret_value().split(",") if k.strip())
