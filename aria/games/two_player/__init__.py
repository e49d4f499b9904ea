"""Two-player games (Bargaining, Negotiation, after GLEE): Alice and Bob, each a policy or an opponent.

- glee.py: the rules and payoffs (configurations, moves, matches, normalised rewards); no I/O
- glee_text.py: what the players read (system prompts, transcript lines)
- offers.py: reading a player's reply into a move, and the JSON schema of a legal reply
- scripted.py: the scripted offline opponents (``opponent=scripted``)
- play.py: batched, resumable play (self-play collection and evaluation against an opponent)

Nothing is imported here: each module is imported by its own path.
"""
