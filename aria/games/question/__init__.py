"""Question games (Twenty Questions, Guess My City): one agent asks, an oracle answers.

- game.py: the game (targets, prompt format, win rule, rewards), built from its config
- play.py: batched, resumable play against an oracle (collection and evaluation)
- text.py: normalisation and whole-phrase matching (the win rule's text side)
- oracle.py: the oracle interface and its registry of import paths
- knowledge_base.py: the offline fact-table oracles (the default)
- llm_oracle.py: an oracle answered by a model behind an OpenAI-compatible endpoint
- flan_t5_oracle.py: the original's fine-tuned flan-t5-small oracle
- expert.py: the scripted expert questioner (``policy=scripted``)

Nothing is imported here: each module is imported by its own path.
"""
