"""The intention space (``docs/method.md`` §2-4): embed utterances, cluster them for every
k, aggregate rewards over intention-level histories, choose k, and build the training set."""
