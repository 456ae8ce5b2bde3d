"""The ``lu-service`` command line: ``--help``, ``--version`` and flags for the common settings.

Each flag names one field of :class:`service.config.Settings` and overrides its
``LU_`` variable; ``Settings`` stays the one place that reads the environment.
Secrets (``LU_API_KEY``) have no flag, so they never show in a process list.
"""

from __future__ import annotations

import argparse
import typing
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from service.config import Settings

__all__ = ["FLAGS", "build_parser", "overrides", "service_version"]

# The settings people change when starting by hand; everything else stays an LU_ variable.
FLAGS = (
    "host",
    "port",
    "device",
    "gpu_id",
    "warmup",
    "max_request_bytes",
    "max_elements",
    "max_queue",
    "log_level",
    "log_json",
    "graceful_shutdown_s",
)


def service_version() -> str:
    """The installed distribution's version (read from its metadata, without importing lu_core)."""
    try:
        return version("lu-service")
    except PackageNotFoundError:  # a checkout on sys.path that was never installed
        return "0+unknown"


def _add_flag(parser: argparse.ArgumentParser, name: str) -> None:
    field = Settings.model_fields[name]
    flag = "--" + name.replace("_", "-")
    default = field.default
    help_text = f"{field.description} [env LU_{name.upper()}, default {default}]".replace("%", "%%")
    # SUPPRESS: a flag that is not given is absent, so the environment (or the default) decides.
    common: dict[str, Any] = {"dest": name, "default": argparse.SUPPRESS, "help": help_text}
    annotation = field.annotation
    if annotation is bool:
        parser.add_argument(flag, action=argparse.BooleanOptionalAction, **common)
    elif typing.get_origin(annotation) is typing.Literal:
        parser.add_argument(flag, choices=typing.get_args(annotation), **common)
    elif isinstance(annotation, type) and annotation in (int, float, str):
        parser.add_argument(flag, type=annotation, metavar=name.upper(), **common)
    else:  # pragma: no cover - a new FLAGS entry of another type needs a parser here
        raise TypeError(f"no command-line parser for setting {name!r} of type {annotation!r}")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``lu-service`` / ``python -m service``."""
    parser = argparse.ArgumentParser(
        prog="lu-service",
        description="Batched LU factorization, unpacking and solves over HTTP (native routes and the "
        "Open Inference Protocol v2). The port opens at once; /readyz answers 503 until warm-up is done.",
        epilog="Every setting is also an LU_ environment variable (the flags above override them); "
        "the others, such as LU_API_KEY, are read from the environment only. See the README's settings table.",
    )
    parser.add_argument("--version", action="version", version=f"lu-service {service_version()}")
    for name in FLAGS:
        _add_flag(parser, name)
    return parser


def overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The settings given on the command line, as keyword arguments for :class:`Settings`."""
    return {k: v for k, v in vars(args).items() if k in FLAGS}
