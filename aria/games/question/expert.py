"""A scripted expert questioner for the single-agent games (``policy=scripted``).

It plays Twenty Questions and Guess My City (and their ten-target subsets) through the rollout
machinery like any other policy, and it knows what it means: every turn it plays carries its
true *intention* (``turn["intention"]``), so pipeline step 2 can measure how well the intention
space recovers intentions (adjusted Rand index, NMI).

How it plays (one story per turn):

1. **What is still possible.** The game history is read back from the prompt
   (:meth:`aria.games.question.game.PromptFormat.parse`); a candidate target survives when the
   knowledge-base oracle, asked each past question about that candidate, gives the answer the
   game gave (yes / no / other). So the expert reasons with the oracle's own fact tables
   (``dataset/*_facts.json``), and a random question of the noisy expert narrows the set as well.
2. **What to ask.** One target left: guess it. Otherwise the *intention* that best splits the
   candidates (the largest smaller side, ties broken at random), among the intentions not asked
   yet; when none splits them (identical facts), a random candidate is guessed.
3. **Noise ε.** With probability ε the turn is instead a random fair question (any intention of
   the game) or, as often, a random guess of any target: data of mixed quality.
4. **Surface form.** The intention is rendered through one of its paraphrase templates, chosen at
   random, so one intention has many surface forms. A template is used only if the oracle
   answers it like the intention's first (canonical) template on *every* target of the game, and
   a question template never names a target (the game would count it as a guess).

An intention is a fact of the tables (``living``, ``category=Animals``, ``parts=wheels``,
``size>1.5``, ``continent=Asia``, ``population>5`` ...) or a guess (``guess:Dog``); its *yes-set*
is the targets the oracle says yes to. Randomness comes from (seed, game id, turn), so a game is
the same whatever the batch it was played in, and a resumed collection plays the same games.
"""
from __future__ import annotations

import json
import random
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Mapping, Sequence

from omegaconf import DictConfig, OmegaConf

from aria.games.question.game import QuestionGame, build_game
from aria.games.question.knowledge_base import CATEGORY_TAGS, REFERENCE_SIZE, KnowledgeBaseOracle
from aria.games.question.text import normalize
from aria.io import read_json
from aria.llm.base import Completion, Message
from aria.resources import dataset_file

#: Answer classes the expert compares (an answer's first word).
YES, NO, OTHER = "yes", "no", "other"


def answer_class(answer: str, win_answer: str) -> str:
    """``"yes"``, ``"no"`` or ``"other"`` for an oracle's (or the game's) answer text."""
    if answer == win_answer:
        return YES
    words = normalize(answer).split()
    first = words[0] if words else ""
    if first in {"yes", "correct", "indeed"}:
        return YES
    if first in {"no", "nope"}:
        return NO
    return OTHER


@dataclass(frozen=True)
class Intention:
    """One thing the expert may mean by a turn."""

    name: str  # "living", "continent=Asia", "guess:Dog"
    templates: tuple[str, ...]  # paraphrases; the first is canonical
    guess: str | None = None  # the target a guess names

    @property
    def is_guess(self) -> bool:
        return self.guess is not None


# ---- Twenty Questions: intentions from the object fact table ------------------------------------------
_TQ_BOOLEANS = {
    "living": ["Is it a living thing?", "Is it alive?", "Is it a living organism?", "Would you say it is alive?"],
    "animal": ["Is it an animal?", "Is it some kind of animal?", "Is it a creature?"],
    "plant": ["Is it a plant?", "Is it a kind of plant?", "Does it grow like a plant?"],
    "man_made": ["Is it man-made?", "Is it manufactured?", "Is it made by humans?", "Is it artificial?"],
    "electronic": ["Is it electronic?", "Does it use electricity?", "Is it an electronic device?", "Does it need a battery?"],
    "edible": ["Is it edible?", "Can you eat it?", "Is it food?", "Is it something you eat?"],
    "worn": ["Is it worn?", "Can you wear it?", "Is it something you wear?", "Do people wear it?"],
    "held_in_hand": ["Can you hold it in your hand?", "Is it handheld?", "Is it held in the hand?"],
}
_TQ_FIELDS = {  # fact field -> templates with {x}
    "traits": ["Would you describe it as {x}?", "Is it {x}?", "Could it be described as {x}?", "Is it something {x}?"],
    "parts": ["Does it have {x}?", "Does it have any {x}?", "Does it come with {x}?"],
    "uses": ["Is it used for {x}?", "Can it be used for {x}?", "Do people use it for {x}?", "Is it meant for {x}?"],
    "found": ["Is it found in the {x}?", "Would you find it in the {x}?", "Is it commonly found in the {x}?",
              "Can you find it in the {x}?"],
    "materials": ["Is it made of {x}?", "Is it made from {x}?", "Does it contain {x}?", "Is it made out of {x}?"],
    "colors": ["Is it {x}?", "Is it {x} in colour?", "Is it usually {x}?", "Is it {x} in color?"],
    "shapes": ["Is it {x}?", "Is it {x} in shape?", "Does it have a {x} shape?", "Is its shape {x}?"],
}
_TQ_CATEGORY = ["Is it {a} {x}?", "Is it a type of {x}?", "Would you call it {a} {x}?", "Is it some kind of {x}?"]
_TQ_SIZE = ["Is it bigger than {a} {x}?", "Is it larger than {a} {x}?", "Is it bigger than {a} typical {x}?"]


def _article(word: str) -> str:
    return "an" if word[:1].lower() in "aeiou" else "a"


def _plural(name: str) -> bool:
    return name.lower().endswith("s") and not name.lower().endswith(("ss", "us"))


def _fill(template: str, x: str) -> str:
    return template.replace("{a}", _article(x)).replace("{x}", x)


def _twenty_questions_intentions(game: QuestionGame, facts: Mapping[str, Any]) -> list[Intention]:
    objects = {t.name: facts["objects"][t.name] for t in game.targets}
    intentions = [Intention(key, tuple(templates)) for key, templates in _TQ_BOOLEANS.items()]
    for category in sorted({o["category"] for o in objects.values()}):
        phrases = CATEGORY_TAGS.get(category, [])
        if phrases:
            intentions.append(Intention(f"category={category}", tuple(_fill(t, phrases[0]) for t in _TQ_CATEGORY)))
    by_size: dict[float, list[str]] = {}
    for ref, size in REFERENCE_SIZE.items():
        by_size.setdefault(size, []).append(ref)
    for size, refs in sorted(by_size.items()):
        intentions.append(Intention(f"size>{size:g}", tuple(_fill(t, ref) for ref in refs for t in _TQ_SIZE)))
    # A phrase of one object only is nearly a guess; on a long list only shared phrases are asked.
    least = 1 if len(objects) <= 20 else 2
    for field, templates in _TQ_FIELDS.items():
        counts: dict[str, int] = {}
        for o in objects.values():
            for value in dict.fromkeys(o.get(field, [])):
                counts[value] = counts.get(value, 0) + 1
        for value, n in sorted(counts.items()):
            if n >= least:
                intentions.append(Intention(f"{field}={value}", tuple(_fill(t, value) for t in templates)))
    for t in game.targets:
        x = t.name.lower()
        forms = ["Is it {x}?", "Is the object {x}?", "Is it {x} by any chance?"] if _plural(x) else \
            ["Is it {a} {x}?", "Is the object {a} {x}?", "Is it {a} {x} by any chance?", "Are you thinking of {a} {x}?"]
        intentions.append(Intention(f"guess:{t.name}", tuple(_fill(f, x) for f in forms), guess=t.name))
    return intentions


# ---- Guess My City: intentions from the city fact table -----------------------------------------------
_SUBJECTS = ["your city", "the city", "the city you're thinking of", "your mystery city", "this city"]
_GMC_FIELDS: list[tuple[str, list[str]]] = [  # (fact family, templates with {s} = subject and {x})
    ("continent", ["Is {s} in {x}?", "Is {s} located in {x}?", "Is {s} on the continent of {x}?", "Can {s} be found in {x}?"]),
    ("region", ["Is {s} in {x}?", "Is {s} located in {x}?", "Is {s} somewhere in {x}?"]),
    ("country", ["Is {s} in {x}?", "Is {s} located in {x}?", "Is {s} a city in {x}?"]),
    ("hemisphere", ["Is {s} in the {x} hemisphere?", "Is {s} located in the {x} hemisphere?"]),
    ("coastal", ["Is {s} on the coast?", "Is {s} a coastal city?", "Is {s} by the sea?"]),
    ("river", ["Does the {x} flow through {s}?", "Is {s} on the {x}?", "Is {s} built along the {x}?"]),
    ("capital", ["Is {s} the capital of its country?", "Is {s} a national capital?", "Is {s} its country's capital?"]),
    ("population", ["Does {s} have a population of over {x} million people?", "Are there more than {x} million people in {s}?",
                    "Does {s} have more than {x} million inhabitants?"]),
    ("language", ["Is {x} the main language spoken in {s}?", "Do people in {s} mainly speak {x}?",
                  "Is the primary language of {s} {x}?"]),
    ("religion", ["Is {x} the main religion in {s}?", "Is {x} the main religion of {s}?"]),
    ("climate", ["Does {s} have a {x} climate?", "Is the weather in {s} {x}?", "Is the climate of {s} {x}?"]),
    ("olympics", ["Has {s} hosted the Olympics?", "Has {s} ever hosted the Olympic Games?"]),
    ("financial", ["Is {s} a financial centre?", "Is {s} a major financial center?"]),
    ("altitude", ["Is {s} at a high altitude?", "Is {s} at a high elevation?"]),
    ("ancient", ["Is {s} an ancient city?", "Does {s} have an ancient history?"]),
    ("largest", ["Is {s} the largest city in its country?", "Is {s} the biggest city in its country?"]),
]
_POPULATION_THRESHOLDS = (1, 2, 3, 5, 8, 10, 15)


def _guess_my_city_intentions(game: QuestionGame, facts: Mapping[str, Any]) -> list[Intention]:
    cities = {t.name: facts["cities"][t.name] for t in game.targets}
    values: dict[str, list[str]] = {
        "continent": sorted({c["continent"] for c in cities.values()}),
        "region": sorted({c["region"] for c in cities.values()}),
        "country": sorted({c["country"] for c in cities.values()}),
        "hemisphere": ["northern", "southern", "eastern", "western"],
        "river": sorted({r for c in cities.values() for r in c.get("rivers", [])}),
        "population": [str(n) for n in _POPULATION_THRESHOLDS],
        "language": sorted({lang for c in cities.values() for lang in c["languages"][:1]}),
        "religion": sorted({r for c in cities.values() for r in c.get("religions", [])[:1] if "(" not in r}),
        "climate": sorted({t for c in cities.values() for t in c.get("climate_tags", [])}),
    }
    intentions = []
    for family, templates in _GMC_FIELDS:
        for x in values.get(family, [""]):
            forms = tuple(t.replace("{x}", x).replace("{s}", s) for t in templates for s in _SUBJECTS)
            intentions.append(Intention(f"{family}={x}" if x else family, forms))
    for t in game.targets:
        forms = [f"Is it {t.name}?", f"Is your city {t.name}?", f"Is the city {t.name}?", f"Could it be {t.name}?",
                 f"Is the city you're thinking of {t.name}?"]
        intentions.append(Intention(f"guess:{t.name}", tuple(forms), guess=t.name))
    return intentions


_INTENTIONS = {"twenty_questions": _twenty_questions_intentions, "guess_my_city": _guess_my_city_intentions}


class ExpertQuestioner:
    """The fact tables, the intentions of one game and their checked templates (see module doc)."""

    def __init__(self, game_cfg: Mapping[str, Any]):
        self.game = build_game(game_cfg)
        if self.game.family not in _INTENTIONS:
            raise ValueError(f"the scripted expert plays {sorted(_INTENTIONS)} games, not {self.game.name!r} "
                             f"(family {self.game.family!r})")
        self.oracle = KnowledgeBaseOracle(game_cfg)
        facts = read_json(dataset_file(game_cfg["facts_file"]))
        self.targets = [t.name for t in self.game.targets]
        self.intentions: list[Intention] = []
        self.yes: dict[str, frozenset[str]] = {}  # intention name -> targets answered yes
        self._checked: dict[tuple[str, str], bool] = {}  # (intention, template) -> usable
        self._classes: dict[tuple[str, str], str] = {}  # (target, question) -> answer class
        for intention in _INTENTIONS[self.game.family](self.game, facts):
            if intention.is_guess:
                if not self._guess_ok(intention.templates[0], intention.guess):
                    raise ValueError(f"{self.game.name}: the guess {intention.templates[0]!r} does not win for {intention.guess}")
                self.yes[intention.name] = frozenset([intention.guess])
                self.intentions.append(intention)
                continue
            canonical = intention.templates[0]
            if self.game.named_targets(canonical):
                continue
            classes = {t: self._class(t, canonical) for t in self.targets}
            yes = frozenset(t for t, c in classes.items() if c == YES)
            # An intention must be answered yes or no on every target, and tell some apart.
            if OTHER in classes.values() or not yes or len(yes) == len(self.targets):
                continue
            self.yes[intention.name] = yes
            self.intentions.append(intention)
        self.by_name = {i.name: i for i in self.intentions}

    def _class(self, target: str, question: str) -> str:
        """The class of the answer the game gives to ``question`` about ``target`` (memoised)."""
        key = (target, question)
        if key not in self._classes:
            if self.game.is_win(question, target):
                self._classes[key] = YES
            else:
                self._classes[key] = answer_class(self.oracle.answer_one(target, question), self.game.win_answer)
        return self._classes[key]

    def _guess_ok(self, question: str, target: str) -> bool:
        return self.game.extract_question(f"Question: {question}") == question and self.game.is_win(question, target) \
            and all(not self.game.is_win(question, other) for other in self.targets if other != target)

    def usable(self, intention: Intention, template: str) -> bool:
        """Whether ``template`` means ``intention`` to the oracle on every target (memoised)."""
        key = (intention.name, template)
        if key not in self._checked:
            if intention.is_guess:
                ok = self._guess_ok(template, intention.guess)
            else:
                ok = self.game.extract_question(f"Question: {template}") == template \
                    and not self.game.named_targets(template) \
                    and all((self._class(t, template) == YES) == (t in self.yes[intention.name]) for t in self.targets)
            self._checked[key] = ok
        return self._checked[key]

    def render(self, intention: Intention, rng: random.Random) -> str:
        """A usable paraphrase of ``intention``, chosen at random (the canonical one always is)."""
        order = list(intention.templates[1:])
        rng.shuffle(order)
        for template in order:
            if self.usable(intention, template):
                return template
        return intention.templates[0]

    def candidates(self, history: Sequence[tuple[str, str]]) -> list[str]:
        """Targets consistent with every (question, answer) of the history, by the oracle's tables."""
        alive = list(self.targets)
        for question, answer in history:
            seen = answer_class(answer, self.game.win_answer)
            alive = [t for t in alive if self._class(t, question) == seen]
        return alive

    def choose(self, history: Sequence[tuple[str, str]], rng: random.Random, epsilon: float) -> Intention:
        """The intention of the next turn (module doc, steps 1-3)."""
        if rng.random() < epsilon:
            if rng.random() < 0.5:
                return self.by_name[f"guess:{rng.choice(self.targets)}"]
            return rng.choice([i for i in self.intentions if not i.is_guess])
        alive = self.candidates(history)
        if not alive:  # answers the tables cannot explain (another oracle): start over
            alive = list(self.targets)
        if len(alive) == 1:
            return self.by_name[f"guess:{alive[0]}"]
        asked = {normalize(q) for q, _ in history}
        alive_set = frozenset(alive)
        best, best_score = [], 0
        for intention in self.intentions:
            if intention.is_guess or any(normalize(t) in asked for t in intention.templates):
                continue
            yes = len(self.yes[intention.name] & alive_set)
            score = min(yes, len(alive) - yes)
            if score > best_score:
                best, best_score = [intention], score
            elif score == best_score and score > 0:
                best.append(intention)
        if not best:
            return self.by_name[f"guess:{rng.choice(alive)}"]
        return rng.choice(best)


@lru_cache(maxsize=8)
def _expert_for(game_key: str) -> ExpertQuestioner:
    return ExpertQuestioner(json.loads(game_key))


class ScriptedExpertPolicy:
    """The expert as a chat policy (:class:`aria.llm.base.ChatModel`): ``policy=scripted``.

    Args:
        game: the game's config (``${game}`` in ``config/policy/scripted.yaml``).
        epsilon: the chance that a turn is a random fair question or a random guess.
        seed: with the game id and the turn, fixes every random choice.
    """

    def __init__(self, game: Mapping[str, Any], epsilon: float = 0.0, seed: int = 0, name: str = "scripted"):
        if not 0.0 <= float(epsilon) <= 1.0:
            raise ValueError(f"epsilon: expected a probability in [0, 1], got {epsilon!r}")
        game = _plain(game)
        self.expert = _expert_for(json.dumps(game, sort_keys=True))
        self.epsilon, self.seed = float(epsilon), int(seed)
        self.name = f"scripted-eps{self.epsilon:g}"
        self.settings = {"name": "scripted", "epsilon": self.epsilon, "seed": self.seed}

    def generate(self, conversations: Sequence[list[Message]], keys: Sequence[str] | None = None,
                 formats=None) -> list[Completion]:
        """The expert's turns; ``formats`` is ignored (its templates are the game's question format)."""
        keys = list(keys) if keys is not None else [str(i) for i in range(len(conversations))]
        out = []
        for messages, key in zip(conversations, keys):
            try:
                history = self.expert.game.prompt.parse(messages[-1]["content"])
            except ValueError as error:
                out.append(Completion(None, f"scripted expert: {error}"))
                continue
            rng = random.Random(f"{self.seed}:{key}:{len(history)}")
            intention = self.expert.choose(history, rng, self.epsilon)
            out.append(Completion(f"Question: {self.expert.render(intention, rng)}", intention=intention.name))
        return out

    def release(self, key: str) -> None:  # stateless: the history is read from the prompt
        pass


def _plain(cfg: Mapping[str, Any]) -> dict:
    """A game config as plain containers (a Hydra node is resolved)."""
    if isinstance(cfg, DictConfig):
        return OmegaConf.to_container(cfg, resolve=True)
    return dict(cfg)
