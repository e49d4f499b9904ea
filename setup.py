"""Installable package `aria`: a reproduction of ARIA (intention-driven reward aggregation).

Install for development with ``pip install -e ".[test]"`` after ``pip install torch==2.13.0``
(see README.md: an unpinned torch pulls several GB of CUDA packages on CPU machines).
"""
from setuptools import find_packages, setup

setup(
    name="aria",
    version="0.1.0",
    description="ARIA: training language agents with intention-driven reward aggregation (reproduction)",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["aria", "aria.*"]),
    # the vLLM server script the library starts; the words of an experiment's table.md
    package_data={"aria.llm": ["serve_vllm.sh"], "aria.experiment": ["table.md.j2"]},
    install_requires=[
        "torch",  # pinned by the set-up scripts (torch==2.13.0), not here, so GPU users keep their build
        "transformers>=5.0",
        "accelerate>=1.0",
        "hydra-core>=1.3",
        "sentence-transformers>=3.0",
        "scikit-learn>=1.3",
        "openai>=1.0",
        "requests",  # the reward-model scoring client
        "peft>=0.13",
        "safetensors",
        "gguf>=0.10",  # reads the embedded SmolLM2 GGUF file once, to convert it to safetensors
        "numpy",
        "pyyaml",
        "tqdm",
        "matplotlib",
        "jinja2>=3.0",  # the words of an experiment's table.md (aria/experiment/table.md.j2)
        "jsonschema>=4.18",  # the run's files a report reads, checked (aria/experiment/report.py)
        "llguidance>=1.0",  # grammar-constrained decoding of the local policy (aria/llm/constrained.py)
    ],
    extras_require={
        # datasets: a test loads the pipeline's train.json with it, as users do; the package reads its
        # training sets with its own reader, which names the file, sample and field of a bad record.
        "test": ["pytest>=8", "pytest-xdist", "hypothesis", "datasets>=3.0"],
        # Mutation testing of the core (benchmarks/mutation.py; docs/testing.md, "Mutation testing").
        "mutation": ["mutmut==3.8.1"],
        # GPU machines only: vllm serves the policy for evaluation, deepspeed runs ZeRO-3.
        "gpu": ["vllm", "deepspeed"],
    },
)
