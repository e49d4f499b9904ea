"""The games, one folder per family (aria.games.family says what differs between them).

- base.py: game configs whatever the family (known games, loading, structured_output)
- family.py: the two families and the registry every command asks (FAMILIES, family_of)
- question/: question games (Twenty Questions, Guess My City) and their oracles
- two_player/: two-player games (Bargaining, Negotiation) and their scripted opponents
"""
