"""The host allocator setting: glibc keeps freed blocks for reuse; the engine applies it to CPU training."""

from __future__ import annotations

import platform
import subprocess
import sys
import textwrap

import pytest

from selfsup import host
from ssl_helpers import tiny_config

GLIBC = platform.libc_ver()[0] == "glibc"


@pytest.mark.spawn
def test_freed_blocks_are_reused_instead_of_fresh_pages():
    """In a fresh process: before the setting a 64 MiB block is an mmap of its own (mallinfo2's hblkhd
    grows by it); after it, the block comes from the heap (arena grows, hblkhd does not), and once
    freed it stays there, so the next one reuses it without growing the heap again."""
    code = textwrap.dedent("""
        import ctypes
        from selfsup import host
        libc = ctypes.CDLL("libc.so.6")
        class Info(ctypes.Structure):
            _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd",
                        "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]
        libc.mallinfo2.restype = Info
        libc.malloc.restype = ctypes.c_void_p
        libc.free.argtypes = [ctypes.c_void_p]
        n = 64 << 20
        def grows():
            a, m = libc.mallinfo2().arena, libc.mallinfo2().hblkhd
            p = libc.malloc(n)
            info = libc.mallinfo2()
            return p, info.arena - a, info.hblkhd - m
        p, arena, mapped = grows()
        assert mapped >= n and arena < n, (arena, mapped)
        libc.free(p)
        assert set(host.cache_freed_memory()) == {"M_MMAP_THRESHOLD", "M_TRIM_THRESHOLD", "M_TOP_PAD"}
        p, arena, mapped = grows()
        assert mapped == 0 and arena >= n, (arena, mapped)
        libc.free(p)
        p, arena, mapped = grows()
        assert mapped == 0 and arena == 0, (arena, mapped)
        print("ok")
    """)
    if not GLIBC:  # nothing to tune: the call must say so and change nothing
        assert host.cache_freed_memory() is None
        return
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


@pytest.mark.train
@pytest.mark.parametrize("setting", ["cached", "system"])
def test_the_engine_applies_the_setting_to_cpu_training(tmp_path, monkeypatch, setting):
    from selfsup import engine

    calls = []
    monkeypatch.setattr(host, "cache_freed_memory", lambda: calls.append(1))
    cfg = tiny_config("simsiam", trainer={"host_allocator": setting, "limit_train_batches": 1},
                      output_dir=str(tmp_path), name=setting)
    engine.pretrain(cfg, "test")
    assert calls == ([1] if setting == "cached" else [])


def test_an_unknown_setting_is_one_line():
    from selfsup.errors import UserError

    with pytest.raises(UserError, match="trainer.host_allocator='tcmalloc' is not known; use cached or system"):
        tiny_config("simsiam", trainer={"host_allocator": "tcmalloc"})
