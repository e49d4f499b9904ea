"""What the CPU computes natively, and the generation dtype that follows from it.

vLLM's CPU build runs bfloat16 through oneDNN kernels that need AVX512-BF16 or AMX; on a CPU
with neither (AVX2 only) bfloat16 is emulated and slower than float32, and some kernels die with
SIGILL. So the dtype is a function of the CPU's flags, decided here once and used by
``scripts/serve_vllm.sh`` (which runs this file as a script: it imports nothing of the package)
and by the benchmarks.

    python aria/llm/hardware.py vllm-dtype     # bfloat16 | float32 for this machine
    python aria/llm/hardware.py flags          # the flags that decide it, and the model name

``ARIA_CPUINFO`` names another file to read than ``/proc/cpuinfo`` (tests).
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

CPUINFO = os.environ.get("ARIA_CPUINFO", "/proc/cpuinfo")

#: A CPU with any of these computes bfloat16 matrix products natively.
BF16_FLAGS = ("avx512_bf16", "amx_bf16")


def cpu_flags(cpuinfo: str | Path = CPUINFO) -> set[str]:
    """The feature flags of the first processor in ``cpuinfo`` (empty where there is no such file)."""
    try:
        text = Path(cpuinfo).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):  # x86, ARM
            return set(value.split())
    return set()


def cpu_model(cpuinfo: str | Path = CPUINFO) -> str:
    try:
        text = Path(cpuinfo).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "unknown"
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name":
            return value.strip()
    return "unknown"


def vllm_cpu_dtype(flags: set[str]) -> str:
    """``"bfloat16"`` where the CPU has AVX512-BF16 or AMX-BF16, else ``"float32"``."""
    return "bfloat16" if any(flag in flags for flag in BF16_FLAGS) else "float32"


def describe(cpuinfo: str | Path = CPUINFO) -> dict:
    """The facts a benchmark records beside its figures."""
    flags = cpu_flags(cpuinfo)
    interesting = sorted(f for f in flags if f.startswith(("avx", "amx")) or f in ("fma", "f16c"))
    return {"cpu_model": cpu_model(cpuinfo), "cores": os.cpu_count(), "flags": interesting,
            "vllm_cpu_dtype": vllm_cpu_dtype(flags)}


def label(description: dict) -> str:
    """How a benchmark's table names the CPU of a :func:`describe` record: "AMD EPYC, 2 cores (avx512_bf16)"."""
    native = ", ".join(f for f in description["flags"] if f.startswith(("avx512_bf16", "amx"))) or "AVX2 only"
    return f"{description['cpu_model']}, {description['cores']} cores ({native})"


if __name__ == "__main__":
    command = sys.argv[1] if len(sys.argv) > 1 else "vllm-dtype"
    if command == "vllm-dtype":
        print(vllm_cpu_dtype(cpu_flags()))
    elif command == "flags":
        print(json.dumps(describe()))
    else:
        sys.exit(f"usage: {sys.argv[0]} vllm-dtype | flags")
