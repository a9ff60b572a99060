"""Ludic's own C++ CPU kernels: one shared library, built at first use from this folder's ``*.cpp`` files.

The kernels (``decode_gemm.cpp``: the decoding matmuls; ``decode_attention.cpp``: the decoding step's
attention over a shared prompt and each row's own tokens; ``swiglu.cpp``: training's gated-MLP elementwise
part; ``rms_norm.cpp``: training's RMSNorms; ``decode_layers.cpp``: a decoding step through every layer in one
call; ``simd16.h``: 16 fp32 lanes on AVX-512 or AVX2; ``simd_exp.h``: the shared exponential) are compiled
together, for the widest instruction set this CPU runs (``isa()``), with the system's C++ compiler (``$CXX``, else ``c++``/``g++``) into ``$LUDIC_KERNELS_DIR`` (default ``~/.cache/ludic/kernels``),
named by a hash of the sources and flags (one library per instruction set), and loaded with ``ctypes`` (calls release the GIL). They thread
with OpenMP; loaded after torch, they share torch's OpenMP runtime (one thread pool) and take torch's
thread count at each call. ``library()`` says why not, once per process, off x86-64 Linux, on a CPU
without AVX2 or AVX-512 (as torch sees it), or without a working compiler; each kernel's module probes its own
function against PyTorch before the library serves it and otherwise keeps PyTorch's path.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

import torch

SOURCES = tuple(sorted(Path(__file__).parent.glob("*.cpp")))
HEADERS = tuple(sorted(Path(__file__).parent.glob("*.h")))
BASE_FLAGS = ("-O3", "-fopenmp", "-shared", "-fPIC", "-std=c++17")
ISA_FLAGS = {"avx512": ("-mavx512f", "-mfma"), "avx2": ("-mavx2", "-mfma")}
"""The instruction sets the kernels are built for (``simd16.h``), widest first."""
KERNELS_DIR_ENV = "LUDIC_KERNELS_DIR"
ISA_ENV = "LUDIC_KERNELS_ISA"
BUILD_TIMEOUT_S = 300

_P, _I64, _I32, _F32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_float
SIGNATURES: dict[str, list[type]] = {
    # x, rows, in, packed weight, out, bias, y, threads
    "ludic_decode_gemm": [_P, _I64, _I64, _P, _I64, _P, _P, _I32],
    # q, its row stride, k_new, its row stride, v_new, its row stride, k_pre, v_pre, pre_bias, prompt, k_suf,
    # v_suf, max_new, column, rows, kv_heads, groups, head_dim, width, scale, out, threads
    "ludic_decode_attention": [_P, _I64, _P, _I64, _P, _I64, _P, _P, _P, _P, _P, _P,
                               _I64, _I64, _I64, _I64, _I64, _I64, _I64, _F32, _P, _I32],
    # g, u, p, elements, threads
    "ludic_swiglu": [_P, _P, _P, _I64, _I32],
    # g, u, dp, p (or null), du, dg, elements, threads
    "ludic_swiglu_backward": [_P, _P, _P, _P, _P, _P, _I64, _I32],
    # x, w, y, r, rows, hidden, eps, threads
    "ludic_rms_norm": [_P, _P, _P, _P, _I64, _I64, _F32, _I32],
    # x, w, r, dy, dx (or null), dw (or null), rows, hidden, threads
    "ludic_rms_norm_backward": [_P, _P, _P, _P, _P, _P, _I64, _I64, _I32],
    # x, cos, sin, per-layer pointer table, sizes, pre_bias, prompt, eps, scale, scratch, threads
    "ludic_decode_layers": [_P, _P, _P, _P, _P, _P, _P, _F32, _F32, _P, _I32],
}  # fmt: skip
"""Every exported function's argument types (all return void)."""


def kernels_dir() -> Path:
    """Where built kernels are kept: ``$LUDIC_KERNELS_DIR``, else ``~/.cache/ludic/kernels``."""
    configured = os.environ.get(KERNELS_DIR_ENV)
    return Path(configured) if configured else Path.home() / ".cache" / "ludic" / "kernels"


def compiler() -> str | None:
    """The C++ compiler to build with: ``$CXX``, else ``c++`` or ``g++`` on the PATH (None: none)."""
    return os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")


def cpu_isas() -> tuple[str, ...]:
    """The instruction sets of ``ISA_FLAGS`` this CPU runs, widest first (torch's own dispatch level: its AVX2
    level needs FMA as well)."""
    capability = torch.backends.cpu.get_cpu_capability()
    if capability.startswith("AVX512"):
        return ("avx512", "avx2")
    return ("avx2",) if capability == "AVX2" else ()


def isa() -> str | None:
    """The instruction set to build for: ``$LUDIC_KERNELS_ISA`` (``avx512`` or ``avx2``: an AVX-512 machine
    can run and measure the AVX2 build; ``off``: none, every kernel on its PyTorch path) when set, else the
    widest this CPU runs; None when it runs none."""
    requested = os.environ.get(ISA_ENV, "").strip().lower()
    if requested in ("", "auto"):
        return next(iter(cpu_isas()), None)
    if requested != "off" and requested not in ISA_FLAGS:
        raise ValueError(f"${ISA_ENV}={os.environ[ISA_ENV]!r}: expected auto, {', '.join(ISA_FLAGS)} or off")
    return requested if requested in cpu_isas() else None


def flags() -> tuple[str, ...]:
    """The compiler flags for ``isa()`` (which must not be None)."""
    chosen = isa()
    assert chosen is not None
    return (BASE_FLAGS[0], *ISA_FLAGS[chosen], *BASE_FLAGS[1:])


def unsupported() -> str | None:
    """Why this machine cannot run the kernels at all (None when they can be built here)."""
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        return f"it is built for x86-64 Linux, not {platform.system()} {platform.machine()}"
    if isa() is None:
        capability = torch.backends.cpu.get_cpu_capability()
        wanted = os.environ.get(ISA_ENV, "").strip().lower()
        if wanted == "off":
            return f"${ISA_ENV}=off"
        if wanted not in ("", "auto"):
            return f"${ISA_ENV}={wanted} asks for instructions this CPU lacks (torch runs its {capability} kernels)"
        return f"this CPU runs torch's {capability} kernels, not AVX2 or AVX-512"
    if compiler() is None:
        return "no C++ compiler was found ($CXX, c++, g++)"
    return None


def library_path(cxx: str) -> Path:
    """The built library's file for these sources (and the headers they include), flags and compiler."""
    digest = hashlib.sha256()
    for source in SOURCES + HEADERS:
        digest.update(source.name.encode() + b"\0" + source.read_bytes())
    digest.update(" ".join((cxx, *flags())).encode())
    return kernels_dir() / f"ludic_kernels-{isa()}-{digest.hexdigest()[:16]}.so"


def _build(cxx: str, target: Path) -> None:
    """Compile into a temporary file beside ``target`` and move it into place (atomic: no half-written library)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=target.stem, suffix=".so.tmp", dir=target.parent)
    os.close(fd)
    try:
        done = subprocess.run(
            [cxx, *flags(), *map(str, SOURCES), "-o", tmp], capture_output=True, text=True, timeout=BUILD_TIMEOUT_S
        )
        if done.returncode != 0:
            raise RuntimeError(f"{cxx} failed (exit {done.returncode}): {done.stderr.strip()[-400:]}")
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _bind(path: Path) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(path))
    for name, argtypes in SIGNATURES.items():
        function = getattr(lib, name)  # AttributeError: a stale or foreign file under this name
        function.argtypes, function.restype = argtypes, None
    return lib


def _load() -> ctypes.CDLL:
    """The built library: from the cache, else compiled now (and once more if a cached file will not load)."""
    cxx = compiler()
    assert cxx is not None
    path = library_path(cxx)
    if path.exists():
        try:
            return _bind(path)
        except (OSError, AttributeError):  # not a loadable library of these kernels (a truncated copy): rebuild
            pass
    _build(cxx, path)
    return _bind(path)


@functools.cache
def library() -> tuple[ctypes.CDLL | None, str | None]:
    """(the loaded library, None) or (None, why not); tried once per process."""
    reason = unsupported()
    if reason is not None:
        return None, reason
    try:
        return _load(), None
    except (OSError, AttributeError, RuntimeError, subprocess.SubprocessError) as error:
        return None, f"it could not be built or loaded ({type(error).__name__}: {error})"


def checked(
    probe: Callable[[ctypes.CDLL], bool], *, compared_with: str, kernel: str, fallback: str, log: logging.Logger
) -> tuple[ctypes.CDLL | None, str | None]:
    """(the library, None) when it loads and ``probe`` passes on it, else (None, why not), logged once by the
    caller (each kernel module caches this per process): ``kernel`` is off and ``fallback`` runs instead."""
    lib, reason = library()
    if lib is not None and not probe(lib):
        lib, reason = None, f"the built kernel gives other values than {compared_with} on a probe"
    if reason is not None:
        log.warning("ludic.kernels: the %s kernel is off: %s; %s", kernel, reason, fallback)
    return lib, reason


class ProbedKernel:
    """One kernel of the library as its module serves it: loaded and probed once per process (``checked``),
    then ``available()``, ``unavailable_reason()`` and ``lib()`` (the library, or a RuntimeError naming why
    not) for the module's callers; ``cache_clear()`` forgets the outcome (tests build again)."""

    def __init__(
        self, probe: Callable[[ctypes.CDLL], bool], *, kernel: str, compared_with: str, fallback: str,
        log: logging.Logger,
    ) -> None:  # fmt: skip
        self.kernel = kernel
        self._check = functools.partial(checked, probe, compared_with=compared_with, kernel=kernel, fallback=fallback, log=log)
        self._outcome: tuple[ctypes.CDLL | None, str | None] | None = None
        self._lock = threading.Lock()

    def outcome(self) -> tuple[ctypes.CDLL | None, str | None]:
        """(the library, None) or (None, why not); decided on first use (the lock only until then: every
        decoding matmul asks)."""
        outcome = self._outcome
        if outcome is not None:
            return outcome
        with self._lock:
            if self._outcome is None:
                self._outcome = self._check()
            return self._outcome

    def available(self) -> bool:
        """This machine builds and runs the kernel (once per process)."""
        return self.outcome()[0] is not None

    def unavailable_reason(self) -> str | None:
        """Why ``available()`` is False (None when it is True)."""
        return self.outcome()[1]

    def lib(self) -> ctypes.CDLL:
        """The library, for a call into this kernel."""
        lib, reason = self.outcome()
        if lib is None:
            raise RuntimeError(f"the {self.kernel} kernel is unavailable: {reason}")
        return lib

    def cache_clear(self) -> None:
        with self._lock:
            self._outcome = None
