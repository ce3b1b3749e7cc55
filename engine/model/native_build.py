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

DOT_FORMS: dict[str, list[str]] = {"byte_pairs": [], "i16": ["-DKVGATE_I16_DOTS"]}
"""The integer dot product's forms (decode_step.c's header): the same sums, other instructions. Which one
is faster on a CPU is measured (engine/model/native_forms.py)."""
DEFAULT_FORM = "byte_pairs"


def cpu_isa(cpuinfo: str | None = None) -> str | None:
    """The widest instruction set this file is built for that the CPU has, or None."""
    isas = cpu_isas(cpuinfo)
    return isas[0] if isas else None


def cpu_isas(cpuinfo: str | None = None) -> list[str]:
    """Every instruction set this file is built for that the CPU runs, widest first (a VNNI part runs the
    AVX2 build too, and which is faster on it is measured: engine/model/native_forms.py)."""
    if cpuinfo is None:
        if platform.machine().lower() not in ("x86_64", "amd64"):
            return []
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return []
    flags: set[str] = set()
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            flags = set(line.partition(":")[2].split())
            break
    return [isa for isa, (needed, _) in _ISA_FLAGS.items() if needed <= flags]


def load_decode_library(
    isa: str | None = None, cache_dir: Path | None = None, form: str = DEFAULT_FORM
) -> ctypes.CDLL | None:
    """The compiled decode step for `isa` (this CPU's by default) in dot-product `form`, building it if
    needed; None where it cannot be built (no suitable CPU, no compiler, or the compiler failed: logged)."""
    isa = isa or cpu_isa()
    if isa is None:
        logger.info("fused decode step: this CPU has neither AVX-512 VNNI nor AVX2; using torch's")
        return None
    flags = ["-O3", "-shared", "-fPIC", "-std=c11", "-pthread", *_ISA_FLAGS[isa][1], *DOT_FORMS[form]]
    digest = source_digest(flags)
    target = (cache_dir or build_dir()) / f"decode_step-{isa}-{form}-{digest}.so"
    if not target.exists():
        if not _compile(flags, target):
            return None
        _remove_older_builds(target, isa, form)
    library = ctypes.CDLL(str(target))
    library.kvgate_decode_step.restype = ctypes.c_int
    library.kvgate_decode_burst.restype = ctypes.c_int64
    return library


def source_digest(extra: list[str] | None = None) -> str:
    """A short hash of decode_step.c and `extra` (the flags): another source or build gets another name."""
    return hashlib.sha256(SOURCE.read_bytes() + " ".join(extra or []).encode()).hexdigest()[:12]


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


def _remove_older_builds(target: Path, isa: str, form: str) -> None:
    """Delete this build's (instruction set and form) other source versions, and builds named before forms
    existed (tens of KB each, one per upgrade).

    A process still running an old build keeps its mapping (Linux frees the file when the last user exits);
    builds for other instruction sets or forms stay, for a cache shared by different machines.
    """
    unformed = f"decode_step-{isa}-" + "?" * 12 + ".so"
    for old in [*target.parent.glob(f"decode_step-{isa}-{form}-*.so"), *target.parent.glob(unformed)]:
        if old != target:
            old.unlink(missing_ok=True)


def build_dir() -> Path:
    """Where builds (and the measured choice of form) are kept: the user cache, else the temp folder."""
    preferred = Path(platformdirs.user_cache_dir("kvgate")) / "native"
    try:
        preferred.mkdir(parents=True, exist_ok=True)
        if os.access(preferred, os.W_OK):
            return preferred
    except OSError:
        pass
    return Path(tempfile.gettempdir()) / "kvgate-native"
