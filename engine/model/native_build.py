"""Compile the fused decode step (engine/model/native/decode_step.c) for this CPU, once, and load it.

The library is built with the machine's C compiler (`$CC`, else `cc` or `gcc`) on first use, in about two
seconds, into the user cache (`~/.cache/kvgate/native/`), named by the source's hash and the instruction set
it was built for, so that an edited source or another CPU gets its own file. Two instruction sets are
built for: AVX-512 with VNNI (integer dot products in one instruction) and AVX2 with FMA (the same sums in
two); a CPU with neither, or a machine without a compiler, gets None and the engine keeps torch's path.
Which one a CPU gets is read from its flags (`/proc/cpuinfo`), never assumed.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import platformdirs

logger = logging.getLogger("kvgate.engine")

SOURCE = Path(__file__).with_name("native") / "decode_step.c"

_ISA_FLAGS: dict[str, tuple[set[str], list[str]]] = {
    "avx512_vnni": (
        {"avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni"},
        ["-mavx2", "-mfma", "-mf16c", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni"],
    ),
    "avx2": ({"avx2", "fma", "f16c"}, ["-mavx2", "-mfma", "-mf16c"]),
}
_COMPILE_SECONDS = 120


def cpu_isa(cpuinfo: str | None = None) -> str | None:
    """The best instruction set this file is built for that the CPU has, or None."""
    if cpuinfo is None:
        if platform.machine().lower() not in ("x86_64", "amd64"):
            return None
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return None
    flags: set[str] = set()
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            flags = set(line.partition(":")[2].split())
            break
    for isa, (needed, _) in _ISA_FLAGS.items():
        if needed <= flags:
            return isa
    return None


def load_decode_library(isa: str | None = None, cache_dir: Path | None = None) -> ctypes.CDLL | None:
    """The compiled decode step for `isa` (this CPU's by default), building it if needed; None where it
    cannot be built (no suitable CPU, no compiler, or the compiler failed: logged)."""
    isa = isa or cpu_isa()
    if isa is None:
        logger.info("fused decode step: this CPU has neither AVX-512 VNNI nor AVX2; using torch's")
        return None
    flags = ["-O3", "-shared", "-fPIC", "-std=c11", "-pthread", *_ISA_FLAGS[isa][1]]
    source = SOURCE.read_bytes()
    digest = hashlib.sha256(source + " ".join(flags).encode()).hexdigest()[:12]
    target = (cache_dir or _cache_dir()) / f"decode_step-{isa}-{digest}.so"
    if not target.exists():
        if not _compile(flags, target):
            return None
        _remove_older_builds(target, isa)
    library = ctypes.CDLL(str(target))
    library.kvgate_decode_step.restype = ctypes.c_int
    return library


def _compile(flags: list[str], target: Path) -> bool:
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        logger.warning("fused decode step: no C compiler (cc, gcc or $CC) found; using torch's")
        return False
    target.parent.mkdir(parents=True, exist_ok=True)
    # Built beside the target and renamed into place: processes starting at once never load a half file.
    with tempfile.NamedTemporaryFile(dir=target.parent, suffix=".so", delete=False) as partial:
        partial_path = Path(partial.name)
    try:
        result = subprocess.run(
            [compiler, *flags, "-o", str(partial_path), str(SOURCE), "-lm"],
            capture_output=True,
            text=True,
            timeout=_COMPILE_SECONDS,
        )
        if result.returncode != 0:
            logger.warning(
                "fused decode step: %s failed; using torch's:\n%s", compiler, result.stderr[-2000:]
            )
            return False
        os.replace(partial_path, target)
        logger.info("fused decode step: built %s", target)
        return True
    except (OSError, subprocess.TimeoutExpired) as error:
        logger.warning("fused decode step: could not run %s (%s); using torch's", compiler, error)
        return False
    finally:
        partial_path.unlink(missing_ok=True)


def _remove_older_builds(target: Path, isa: str) -> None:
    """Delete this instruction set's builds of other source versions (a few hundred KB each, one per upgrade).

    A process still running an old build keeps its mapping (Linux frees the file when the last user exits);
    builds for other instruction sets stay, for a cache shared by different machines.
    """
    for old in target.parent.glob(f"decode_step-{isa}-*.so"):
        if old != target:
            old.unlink(missing_ok=True)


def _cache_dir() -> Path:
    preferred = Path(platformdirs.user_cache_dir("kvgate")) / "native"
    try:
        preferred.mkdir(parents=True, exist_ok=True)
        if os.access(preferred, os.W_OK):
            return preferred
    except OSError:
        pass
    return Path(tempfile.gettempdir()) / "kvgate-native"
