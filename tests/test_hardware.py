"""The generation dtype from the CPU's flags (aria/llm/hardware.py, used by aria/llm/serve_vllm.sh)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from aria.llm.hardware import cpu_flags, describe, vllm_cpu_dtype

REPO = Path(__file__).resolve().parents[1]
X86 = "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Example CPU\nflags\t\t: fpu sse2 avx avx2 fma {extra}\n\n" \
      "processor\t: 1\nflags\t\t: fpu\n"


@pytest.mark.parametrize("extra, dtype", [
    ("", "float32"),                                   # AVX2 only: bf16 would be emulated
    ("avx512f avx512bw", "float32"),                   # AVX-512 without its BF16 extension
    ("avx512f avx512_bf16", "bfloat16"),               # Cooper Lake and later
    ("avx512f amx_tile amx_bf16 amx_int8", "bfloat16"),  # Sapphire Rapids (AMX)
])
def test_dtype_from_given_flags(tmp_path, extra, dtype):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(X86.format(extra=extra))
    flags = cpu_flags(cpuinfo)
    assert {"avx2", "fma"} <= flags and "fpu" in flags  # the first processor's line
    assert vllm_cpu_dtype(flags) == dtype
    assert describe(cpuinfo)["cpu_model"] == "Example CPU" and describe(cpuinfo)["vllm_cpu_dtype"] == dtype
    # what serve_vllm.sh runs: the file as a script, reading ARIA_CPUINFO
    done = subprocess.run([sys.executable, str(REPO / "aria/llm/hardware.py"), "vllm-dtype"], capture_output=True,
                          text=True, env={**os.environ, "ARIA_CPUINFO": str(cpuinfo)}, cwd=tmp_path)
    assert done.returncode == 0 and done.stdout.strip() == dtype


def test_arm_features_and_a_missing_file(tmp_path):
    (tmp_path / "arm").write_text("processor\t: 0\nFeatures\t: fp asimd bf16 sve\n")
    assert cpu_flags(tmp_path / "arm") == {"fp", "asimd", "bf16", "sve"}
    assert vllm_cpu_dtype(cpu_flags(tmp_path / "arm")) == "float32"  # vLLM's bf16 CPU kernels are x86's
    assert cpu_flags(tmp_path / "none") == set() and vllm_cpu_dtype(set()) == "float32"
