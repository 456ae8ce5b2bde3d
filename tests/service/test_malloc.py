"""service.malloc: glibc's thresholds set once at start; the operator's own settings win; a no-op elsewhere."""

from __future__ import annotations

import ctypes
import platform

import pytest

from service import malloc


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc only")
def test_tune_sets_the_thresholds_on_glibc(monkeypatch):
    for name in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES"):
        monkeypatch.delenv(name, raising=False)
    assert malloc.tune() is True
    assert ctypes.CDLL("libc.so.6").mallopt(-3, malloc.MMAP_THRESHOLD) == 1  # the value glibc took


@pytest.mark.parametrize("bad", [0, -5, 1 << 31, 2.5, True, "256"])
def test_thresholds_must_be_positive_byte_counts(bad):
    with pytest.raises(ValueError, match="positive number of bytes"):
        malloc.tune(mmap_threshold=bad)
    with pytest.raises(ValueError, match="positive number of bytes"):
        malloc.tune(trim_threshold=bad)


@pytest.mark.parametrize("name", ["MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES"])
def test_the_operators_malloc_settings_win(monkeypatch, name):
    monkeypatch.setenv(name, "1048576" if name.startswith("MALLOC") else "glibc.malloc.check=0")
    assert malloc.tune() is False


def test_off_linux_it_does_nothing(monkeypatch):
    monkeypatch.setattr(malloc.sys, "platform", "darwin")
    assert malloc.tune() is False
