"""Language models: the text-generation backends a game is played with (aria.llm.base) and the causal-LM policy a trainer updates (aria.llm.policy)."""
