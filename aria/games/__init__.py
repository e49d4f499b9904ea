"""The games, one folder per family (aria.games.family says what differs between them).

- common/: what every game shares (configs: known games, loading, structured_output; settings schemas)
- family.py: the two families and the registry every command asks (FAMILIES, family_of)
- evaluate.py: the evaluation harness (a policy plays a game's targets, one record per game)
- importers.py: the original release's trajectory files, read into this package's records
- question/: question games (Twenty Questions, Guess My City) and their oracles
- two_player/: two-player games (Bargaining, Negotiation) and their scripted opponents
"""
