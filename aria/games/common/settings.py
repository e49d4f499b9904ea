"""The settings of the commands that play games, typed: collection (config/collect.yaml, read
by :func:`aria.games.family.collect_from_config` and the families' ``collect``), the evaluation
harness (config/eval.yaml, :func:`aria.games.evaluate.evaluate_model` and the families'
``evaluate_served``), and each game family's game configs (config/game/, checked by
:func:`aria.games.family.checked_game`). The commands read theirs as attributes (``cfg.num_games``);
a bound is declared once here (:func:`aria.settings.bounded`).

What stays a mapping: a game section (its family checks it against :class:`QuestionGameSettings`
or :class:`TwoPlayerGameSettings` and hands a dict to the game builders, which many callers give
dicts), and the policy, oracle and opponent groups, whose options differ by option; their
registries check them against their classes' parameters (``aria.registry.check_options``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from omegaconf import MISSING

from aria.settings import MAX_GAMES, bounded


@dataclass
class CollectSettings:
    """config/collect.yaml."""
    game: Any = MISSING
    policy: Any = MISSING
    oracle: Any = MISSING
    opponent: Any = MISSING
    num_games: int = bounded(ge=0, le=MAX_GAMES)  # question games (0: none); a two-player game plays games_per_config
    seed: int = bounded(ge=0)
    batch_size: int = bounded(ge=1)
    system_prompt: Optional[str] = MISSING
    progress: bool = MISSING
    force_new: bool = MISSING
    config_set: str = MISSING
    games_per_config: int = bounded(ge=1, le=MAX_GAMES)
    policy_role: str = bounded(one_of=("alice", "bob"))
    out: str = bounded(nonempty=True)


@dataclass
class TwoPlayerEvalSettings:
    config_set: str = MISSING
    games_per_config: int = bounded(ge=1, le=MAX_GAMES)
    max_tokens: int = bounded(ge=1)
    structured_output: Optional[str] = MISSING


@dataclass
class EvalSettings:
    """config/eval.yaml: the evaluation harness."""
    policy: Any = MISSING
    oracle: Any = MISSING
    opponent: Any = MISSING
    envs: List[str] = bounded(nonempty=True)
    num_games: int = bounded(ge=1, le=MAX_GAMES)
    seed: int = bounded(ge=0)
    out: str = bounded(nonempty=True)
    progress: bool = MISSING
    batch_size: Optional[int] = bounded(ge=1)
    force_new: bool = MISSING
    max_turns: Optional[int] = bounded(ge=1)
    structured_output: Optional[str] = MISSING
    two_player: TwoPlayerEvalSettings = field(default_factory=TwoPlayerEvalSettings)


# --- Games (config/game/): one schema per game family (aria.games.family), checked by
# aria.games.family.checked_game where a command takes its game -------------------------------------

@dataclass
class GameIntentionSettings:
    """How pipeline step 1 reads the game's turns (docs/method.md §2): per channel, what is
    clustered or mapped; which channels are trained."""
    channels: Dict[str, Dict[str, str]] = MISSING
    trained: List[str] = MISSING


@dataclass
class QuestionPromptSettings:
    intro: str = MISSING
    history_header: str = MISSING
    turn: str = MISSING
    outro: str = MISSING


@dataclass
class QuestionGameSettings:
    """Twenty Questions, Guess My City and their subsets (config/game/twenty_questions.yaml)."""
    name: str = MISSING
    kind: Optional[str] = None  # the family: absent or "question"
    family: Optional[str] = None  # a subset's full game (twenty_questions_subset -> twenty_questions)
    targets_file: str = MISSING
    targets_format: str = MISSING
    targets_only: Optional[List[str]] = None  # a subset of the targets, the testbed a small model can win
    aliases_file: Optional[str] = None
    facts_file: str = MISSING
    max_turns: int = bounded(ge=1)
    max_question_chars: int = MISSING
    structured_output: str = MISSING
    reply_regex: str = MISSING
    invalid_answer: str = MISSING
    win_answer: str = MISSING
    single_guess: bool = MISSING
    decoys: List[str] = MISSING
    prompt: QuestionPromptSettings = field(default_factory=QuestionPromptSettings)
    intention: GameIntentionSettings = field(default_factory=GameIntentionSettings)


@dataclass
class TwoPlayerGameSettings:
    """Bargaining and Negotiation (config/game/bargaining.yaml); the prompts' and transcripts'
    texts are checked by the game when it renders them (aria.games.two_player.glee)."""
    name: str = MISSING
    kind: str = MISSING
    players: List[str] = MISSING
    display_names: Dict[str, str] = MISSING
    max_reprompts: int = MISSING
    structured_output: str = MISSING
    reply_schema: Dict[str, int] = MISSING
    on_invalid: str = MISSING
    config_sets: Dict[str, Dict[str, List[Any]]] = MISSING
    prompts: Dict[str, Any] = MISSING
    transcript: Dict[str, Any] = MISSING
    intention: GameIntentionSettings = field(default_factory=GameIntentionSettings)
