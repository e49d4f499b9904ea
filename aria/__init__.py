"""ARIA: training language agents with intention-driven reward aggregation.

The library behind the numbered pipeline scripts. Sub-packages:

- :mod:`aria.games`        the games, one folder per family (``question/``, ``two_player/``): rules,
                           prompts, oracles, opponents and the play loops
- :mod:`aria.llm`          text generation: a local transformers model or an OpenAI-compatible endpoint
- :mod:`aria.trajectories` the versioned trajectory schema, JSONL I/O, importers of the original formats
- :mod:`aria.scheduler`    batched, resumable play of many games at once (each family supplies its turn)
"""

__version__ = "0.1.0"
