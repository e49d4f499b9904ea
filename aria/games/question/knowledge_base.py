"""Offline knowledge-base oracles: deterministic answers from fact tables (the default oracle).

The original answered Twenty Questions with a fine-tuned flan-t5 checkpoint and Guess My City
with GPT-4 (docs/method.md §6-7); neither can run offline without weights. This oracle reads the fact
tables in ``dataset/`` (``twenty_questions_facts.json``, ``guess_my_city_facts.json``) and maps
common question forms onto them:

1. *Validity* (Twenty Questions): a yes/no question starts with an auxiliary verb ("Is",
   "Does", "Can", ...); open questions ("What colour is it?"), either/or questions ("Is it a
   cat or a dog?"), statements and gibberish are answered "Invalid Question.".
2. *Guesses*: "Is it a soccer ball?" / "Is it Tokyo?" are answered by comparing the named
   target with the hidden one.
3. *Rules* for what needs arithmetic or a fixed field: size comparisons ("bigger than a
   breadbox?"), population thresholds, hemispheres, capitals, continents, countries.
4. *Tag lookup* for everything else: every fact is a phrase (a trait, part, material, place,
   use, colour, ...). The question's phrases are matched, longest first and with plural forms
   folded, against the vocabulary of all targets; the answer is Yes when a matched phrase is a
   fact of the hidden target. Facts not in the table are false (closed world).

Accuracy on hand-written fair questions is measured in ``tests/test_oracle_accuracy.py``.
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence

from aria.games.question.game import build_game
from aria.games.question.oracle import OracleRequest
from aria.games.question.text import normalize
from aria.io import DataError, read_json
from aria.llm.base import Completion
from aria.resources import dataset_file

AUXILIARIES = {
    "is", "are", "does", "do", "can", "could", "would", "will", "has", "have", "was", "were",
    "should", "did", "may", "might", "shall", "isn", "aren", "doesn", "don", "am",
}
WH_WORDS = {"what", "which", "where", "when", "why", "how", "who", "whom", "whose"}
# Words that carry no fact when they stand alone in a question.
STOP_TAGS = {
    "thing", "object", "item", "used", "use", "made", "found", "type", "kind", "something", "one",
    "part", "has", "have", "can", "be", "is", "of", "in", "on", "for", "the", "a", "an", "to", "it",
    "you", "your", "make", "common", "typically", "usually", "often", "people", "person", "human",
    "way", "other", "any", "some", "many", "more", "most", "time", "very", "big", "small",
}


def stem(word: str) -> str:
    """Fold plural forms so "wheels" matches "wheel" and "batteries" matches "battery"."""
    if len(word) > 4 and word.endswith("ies"):
        return word[:-3] + "y"
    if len(word) > 4 and word.endswith(("ses", "xes", "ches", "shes")):
        return word[:-2]
    if len(word) > 3 and word.endswith("s") and not word.endswith(("ss", "us", "is")):
        return word[:-1]
    return word


@functools.lru_cache(maxsize=1 << 16)
def stem_tokens(text: str) -> tuple[str, ...]:
    return tuple(stem(w) for w in normalize(text).split())


class TagIndex:
    """Longest-first matcher of known fact phrases in a question (on stemmed tokens)."""

    def __init__(self, phrases: Iterable[str]):
        self._by_first: dict[str, list[tuple[str, ...]]] = {}
        for phrase in set(phrases):
            words = stem_tokens(phrase)
            if not words or (len(words) == 1 and words[0] in STOP_TAGS):
                continue
            self._by_first.setdefault(words[0], []).append(words)
        for entries in self._by_first.values():
            entries.sort(key=len, reverse=True)

    def find(self, text: str) -> list[tuple[str, ...]]:
        words = stem_tokens(text)
        found, i = [], 0
        while i < len(words):
            for phrase in self._by_first.get(words[i], ()):
                if words[i : i + len(phrase)] == phrase:
                    found.append(phrase)
                    i += len(phrase)
                    break
            else:
                i += 1
        return found


# ---- Twenty Questions ---------------------------------------------------------------------
SIZE_RANK = {"tiny": 0, "small": 1, "medium": 2, "large": 3, "huge": 4}
# Reference things in size comparisons, on the same scale (x.5 = between two classes).
REFERENCE_SIZE = {
    "coin": 0.5, "fingertip": 0.5, "finger": 0.5, "pea": 0.5, "marble": 0.5, "grape": 0.5,
    "hand": 1.0, "palm": 1.0, "fist": 1.0, "phone": 1.0, "smartphone": 1.0, "apple": 1.0, "pencil": 1.0,
    "book": 1.5, "shoebox": 1.5, "shoe box": 1.5, "breadbox": 1.5, "bread box": 1.5, "loaf of bread": 1.5,
    "toaster": 1.5, "laptop": 1.5, "backpack": 2.0, "basketball": 1.5, "football": 1.5, "microwave": 1.5,
    "chair": 2.0, "cat": 2.0, "dog": 2.0, "suitcase": 2.0, "person": 2.5, "human": 2.5, "man": 2.5,
    "adult": 2.5, "people": 2.5, "refrigerator": 2.5, "fridge": 2.5, "door": 2.5, "table": 2.5,
    "car": 3.0, "couch": 3.0, "sofa": 3.0, "bed": 3.0, "horse": 3.0, "truck": 3.5, "bus": 3.5,
    "elephant": 3.5, "house": 3.5, "building": 3.5,
}
_BIGGER = re.compile(r"\b(bigger|larger|taller|longer|heavier|wider) than (?:a |an |the |your |my |average |typical )*(.+)")
_SMALLER = re.compile(r"\b(smaller|shorter|lighter|tinier|narrower) than (?:a |an |the |your |my |average |typical )*(.+)")
_FITS = re.compile(r"\bfits? (?:in|into|inside|on) (?:a |an |the |your |one |my |someone s )*(.+)")
_GUESS = re.compile(
    r"^(?:is|are) (?:it|this|that|they|these|you|the (?:object|thing|item|word|answer)|your (?:object|thing|word)|this (?:object|thing))"
    r"(?: perhaps| maybe| possibly| actually)? (?:a |an |the |some |a pair of |pair of )?(.+?)(?: perhaps| maybe| by any chance)?$"
)

CATEGORY_TAGS = {
    "Sports": ["sports equipment", "sport", "sports"], "Animals": ["animal"], "Fruits": ["fruit", "food"],
    "Vehicles": ["vehicle", "transportation"], "Clothes": ["clothing", "clothes", "garment", "apparel"],
    "Electronics": ["electronic device", "electronics", "electronic"],
    "Musical Instruments": ["musical instrument", "instrument", "music"], "Furniture": ["furniture"],
    "Office Supplies": ["office supply", "office"], "Vegetables": ["vegetable", "food"], "Art": ["art"],
    "Kitchen Tools": ["kitchen tool", "kitchen utensil", "kitchen"], "Nature": ["nature", "natural"],
    "Toys": ["toy"], "Jewelry": ["jewelry", "jewellery", "accessory"], "Garden Supplies": ["garden tool", "gardening"],
    "Tools": ["tool"],
}
# Facts stored as booleans, and the phrases a question uses for them.
BOOLEAN_TAGS = {
    "living": ["living thing", "living", "alive", "organism", "life form", "living creature", "living organism"],
    "animal": ["animal", "creature"],
    "plant": ["plant"],
    "man_made": ["man made", "manmade", "artificial", "manufactured", "human made", "made by humans", "made by people", "synthetic"],
    "electronic": ["electronic", "electric", "electricity", "battery", "electrical", "plugged in", "plug", "power outlet", "electronic device"],
    "edible": ["edible", "food", "eat", "eaten", "eatable", "snack", "consumed", "something you eat", "ingredient"],
    "worn": ["worn", "wear", "wearable", "wore"],
    "held_in_hand": ["hold", "held", "handheld", "hand held", "carry in your hand"],
}
NOT_MAN_MADE_TAGS = ["natural", "found in nature", "nature", "naturally occurring", "natural object"]


@dataclass
class _ObjectFacts:
    size: float
    tags: set[tuple[str, ...]]


class KnowledgeBaseOracle:
    """Deterministic offline oracle for Twenty Questions and Guess My City (see module doc).

    Built per game from the game's config: ``facts_file`` names the fact table; answers use
    the game's ``invalid_answer`` and ``win_answer``.
    """

    name = "knowledge_base"
    concurrent = True  # answers read fixed tables only: safe from any thread, nothing to batch

    def __init__(self, game_cfg: Mapping[str, Any], facts_file: str | None = None):
        self.game = build_game(game_cfg)
        path = dataset_file(facts_file or game_cfg["facts_file"])
        self.settings = {"name": self.name, "facts_file": path.name}
        facts = read_json(path)
        if self.game.family == "twenty_questions":
            self._answerer = _TwentyQuestionsKB(self.game, facts, path)
        elif self.game.family == "guess_my_city":
            self._answerer = _GuessMyCityKB(self.game, facts, path)
        else:
            raise ValueError(f"no knowledge base for game {self.game.name!r} (family {self.game.family!r})")

    def answer(self, requests: Sequence[OracleRequest]) -> list[Completion]:
        return [Completion(self.answer_one(r.target, r.question)) for r in requests]

    def answer_one(self, target: str, question: str) -> str:
        return self._answerer.answer(target, question)


def _question_shape(norm: str) -> str:
    """``"yes_no"``, ``"open"`` (wh-question) or ``"invalid"`` for a normalised question."""
    words = norm.split()
    if not words:
        return "invalid"
    if words[0] in WH_WORDS or (words[0] in {"in", "on", "at", "from", "to"} and len(words) > 1 and words[1] in WH_WORDS):
        return "open"
    if words[0] in AUXILIARIES:
        return "yes_no"
    return "invalid"


def _is_either_or(norm: str) -> bool:
    """"Is it a cat or a dog?" offers alternatives; "..., or not?" does not."""
    return bool(re.search(r"\bor\b(?! not\b)(?! something\b)", norm))


def _target_entries(game, facts: Any, section: str, path) -> dict[str, dict]:
    """``facts[section][name]`` for every target of ``game``; a missing one is a DataError."""
    table = facts.get(section) if isinstance(facts, dict) else None
    if not isinstance(table, dict):
        raise DataError(path, None, section, "missing or not an object")
    entries = {}
    for target in game.targets:
        entry = table.get(target.name)
        if not isinstance(entry, dict):
            raise DataError(path, None, f"{section}.{target.name}", "missing")
        entries[target.name] = entry
    return entries


class _TwentyQuestionsKB:
    def __init__(self, game, facts: Mapping[str, Any], path):
        self.game = game
        self.facts = {
            name: self._object_facts(entry, path, name)
            for name, entry in _target_entries(game, facts, "objects", path).items()
        }
        self.index = TagIndex(" ".join(t) for f in self.facts.values() for t in f.tags)

    @staticmethod
    def _object_facts(entry: Mapping[str, Any], path, name: str) -> _ObjectFacts:
        size = entry.get("size")
        if size not in SIZE_RANK:
            raise DataError(path, None, f"objects.{name}.size", f"expected one of {sorted(SIZE_RANK)}")
        phrases: list[str] = []
        for key in ("traits", "parts", "uses", "found", "materials", "colors", "shapes"):
            value = entry.get(key, [])
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise DataError(path, None, f"objects.{name}.{key}", "expected a list of strings")
            phrases += value
        phrases += CATEGORY_TAGS.get(entry.get("category", ""), [])
        for key, words in BOOLEAN_TAGS.items():
            if not isinstance(entry.get(key), bool):
                raise DataError(path, None, f"objects.{name}.{key}", "expected true/false")
            if entry[key]:
                phrases += words
        if not entry["man_made"]:
            phrases += NOT_MAN_MADE_TAGS
        if "gray" in entry.get("colors", []):
            phrases.append("grey")
        return _ObjectFacts(float(SIZE_RANK[size]), {stem_tokens(p) for p in phrases if stem_tokens(p)})

    def answer(self, target: str, question: str) -> str:
        yes, no, invalid = "Yes.", "No.", self.game.invalid_answer
        norm = normalize(question or "")
        if _question_shape(norm) != "yes_no" or _is_either_or(norm):
            return invalid
        facts = self.facts[target]
        guess = self._guess(norm)
        if guess is not None:
            return yes if guess == target else no
        size_answer = self._size(norm, facts.size)
        if size_answer is not None:
            return yes if size_answer else no
        matched = self.index.find(norm)
        if not matched:
            return no
        return yes if any(phrase in facts.tags for phrase in matched) else no

    def _guess(self, norm: str) -> str | None:
        """The target named by a question of the form "Is it (a) X?" covering all of X."""
        match = _GUESS.match(norm)
        if not match:
            return None
        rest = match.group(1)
        named = self.game.named_targets(rest)
        if len(named) != 1:
            return None
        target = self.game.target(named[0])
        rest_stems = stem_tokens(rest)
        return named[0] if any(stem_tokens(n) == rest_stems for n in target.names) else None

    @staticmethod
    def _size(norm: str, size: float) -> bool | None:
        for pattern, bigger in ((_BIGGER, True), (_SMALLER, False)):
            match = pattern.search(norm)
            if match:
                ref = _reference_size(match.group(2))
                if ref is None:
                    return None
                return size > ref if bigger else size < ref
        match = _FITS.search(norm)
        if match:
            place = match.group(1)
            if re.search(r"\b(hand|palm|pocket|fist|wallet|purse)", place):
                return size <= 1
            if re.search(r"\b(backpack|bag|box|drawer|suitcase|shoebox|car|trunk)", place):
                return size <= 2
        if re.fullmatch(r"(?:is|are) (?:it|the object|this object|they) (?:very |really )?(?:big|large|huge|enormous|giant)", norm):
            return size >= 3
        if re.fullmatch(r"(?:is|are) (?:it|the object|this object|they) (?:very |really )?(?:small|little|tiny)", norm):
            return size <= (0 if "tiny" in norm else 1)
        return None


def _reference_size(text: str) -> float | None:
    words = normalize(text).split()
    for n in (3, 2, 1):  # "loaf of bread" before "bread"
        key = " ".join(words[:n])
        if key in REFERENCE_SIZE:
            return REFERENCE_SIZE[key]
        if key.endswith("s") and key[:-1] in REFERENCE_SIZE:
            return REFERENCE_SIZE[key[:-1]]
    return None


# ---- Guess My City ------------------------------------------------------------------------
CONTINENT_WORDS = {
    "asia": "Asia", "asian": "Asia", "europe": "Europe", "european": "Europe", "africa": "Africa",
    "african": "Africa", "north america": "North America", "north american": "North America",
    "south america": "South America", "south american": "South America", "oceania": "Oceania",
    "australia": "Oceania",
}
REGION_WORDS = {
    "east asia": ["East Asia"], "southeast asia": ["Southeast Asia"], "south east asia": ["Southeast Asia"],
    "south asia": ["South Asia"], "central asia": ["Central Asia"], "middle east": ["Middle East"],
    "western europe": ["Western Europe"], "eastern europe": ["Eastern Europe"], "southern europe": ["Southern Europe"],
    "northern europe": ["Northern Europe"], "central europe": ["Central Europe"], "north africa": ["North Africa"],
    "west africa": ["West Africa"], "east africa": ["East Africa"], "central africa": ["Central Africa"],
    "southern africa": ["Southern Africa"], "sub saharan africa": ["West Africa", "East Africa", "Central Africa", "Southern Africa"],
    "caribbean": ["Caribbean"], "central america": ["Central America"],
    "latin america": ["South America", "Central America", "Caribbean"],
    "scandinavia": ["Northern Europe"],
}
# "Is it Munich?": a bare name after "is it" / "is your city" is a guess of some other city.
_CITY_GUESS = re.compile(
    r"^(?:is|could) (?:it|your city|the city|this city|the city you re thinking of)(?: be)? "
    r"(?!(?:in|on|at|near|a|an|the|located|known|famous|home|part|situated|close|by|one|called|named|also|considered|capital|coastal|big|large|small|old)\b)"
    r"[a-z]+(?: [a-z]+)?$"
)
NUMBER_WORDS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "ten": 10, "twenty": 20, "fifteen": 15, "half": 0.5}


def _first(values: list, default: str) -> str:
    return values[0] if values else default


# Open ("wh-") questions about a city: (pattern on the normalised question, answer from its facts).
# Order matters: "the official language of your city's country" is about language, not country.
OPEN_TOPICS: list[tuple[str, Callable[[Mapping[str, Any]], str]]] = [
    (r"\b(language|languages|speak|spoken)\b", lambda c: f"The main language spoken there is {c['languages'][0]}."),
    (r"\bcontinent\b", lambda c: f"The city is in {c['continent']}."),
    (r"\b(country|nation)\b", lambda c: f"The city is in {c['country']}."),
    (r"\b(climate|weather|temperature)\b", lambda c: f"It has a {c['climate']}."),
    (r"\brivers?\b", lambda c: f"The {c['rivers'][0]} flows through it." if c.get("rivers") else "No major river flows through it."),
    (r"\b(sea|ocean|coast|body of water)\b", lambda c: f"It lies on the {c['sea']}." if c.get("sea") else "It is not on the coast."),
    (r"\b(population|people live|how big|how large|inhabitants)\b", lambda c: f"About {c.get('population_millions')} million people live in the city."),
    (r"\b(religion|religious)\b", lambda c: f"The main religion is {_first(c.get('religions', []), 'not known')}."),
    (r"\b(currency|money)\b", lambda c: f"The currency is the {c.get('currency')}."),
    (r"\b(landmark|landmarks|monument|attraction|attractions|sights)\b", lambda c: "Famous landmarks include " + ", ".join(c.get("landmarks", [])[:2]) + "."),
    (r"\b(famous|known)\b", lambda c: "It is known for " + ", ".join(c.get("famous_for", [])[:2]) + "."),
    (r"\bregion\b|\bpart of the world\b|\bwhere\b", lambda c: f"The city is in {c['region']}, in {c['continent']}."),
    (r"\bhemisphere\b", lambda c: f"It is in the {c['hemisphere_ns']} and {c['hemisphere_ew']} hemispheres."),
    (r"\btime zone\b", lambda c: f"Its time zone is UTC{c.get('time_zone_utc'):+g}."),
]


_QUESTION_WORDS = {
    "your", "city", "known", "famous", "landmark", "home", "have", "does", "located", "there", "this",
    "that", "with", "from", "think", "thinking", "re", "very", "well", "especially", "particularly",
}


class _GuessMyCityKB:
    """Rule-based answers about a city; answers are short sentences that never name the city."""

    #: The answer to a question naming several cities, which the game does not count as a guess.
    MANY_CITIES = "Please guess one city at a time."

    def __init__(self, game, facts: Mapping[str, Any], path):
        self.game = game
        self.cities = _target_entries(game, facts, "cities", path)
        for name, entry in self.cities.items():
            for key in ("country", "continent", "region", "hemisphere_ns", "hemisphere_ew", "languages", "climate"):
                if key not in entry:
                    raise DataError(path, None, f"cities.{name}.{key}", "missing")
        self.countries: dict[tuple[str, ...], str] = {}
        for entry in self.cities.values():
            for name in [entry["country"], *entry.get("country_aliases", [])]:
                self.countries[stem_tokens(name)] = entry["country"]
        self.country_index = TagIndex(" ".join(k) for k in self.countries)
        self.language_index = TagIndex(lang for e in self.cities.values() for lang in e["languages"])
        self.religion_index = TagIndex(r for e in self.cities.values() for r in e.get("religions", []))
        self.climate_index = TagIndex(t for e in self.cities.values() for t in e.get("climate_tags", []))
        self.river_index = TagIndex(r for e in self.cities.values() for r in e.get("rivers", []))
        self.unknown = (
            "I'm not sure how to answer that. You can ask about the city's continent, country, size, "
            "language, climate, coast, rivers or landmarks."
        )

    # The sentence templates are kept short, like the original GPT-4 oracle's answers.
    def answer(self, target: str, question: str) -> str:
        city = self.cities[target]
        norm = normalize(question or "")
        shape = _question_shape(norm)
        if shape == "invalid":
            return self.game.invalid_answer
        named = self.game.named_targets(norm)
        if len(named) > 1 and self.game.single_guess:  # not a guess by the game's rule; says nothing of them
            return self.MANY_CITIES
        if named:  # the win answer exactly when the game counts a win, never otherwise
            return self.game.win_answer if self.game.is_win(question, target) else "No, that is not my city."
        if shape == "yes_no" and _CITY_GUESS.match(norm) and not self.country_index.find(norm):
            return "No, that is not my city."  # a guess of a city that is not in the list
        text = self._open(norm, city) if shape == "open" else self._yes_no(norm, city)
        return self._redact(text or self.unknown, target)

    def _redact(self, text: str, target: str) -> str:
        for name in self.game.target(target).names:
            text = re.sub(rf"\b{re.escape(name)}\b", "my city's country" if "country" in text.lower() else "it", text, flags=re.IGNORECASE)
        return text

    def _open(self, norm: str, c: Mapping[str, Any]) -> str | None:
        """An open question: the first topic of :data:`OPEN_TOPICS` the question mentions."""
        for pattern, answer in OPEN_TOPICS:
            if re.search(pattern, norm):
                return answer(c)
        return None

    def _yes_no(self, norm: str, c: Mapping[str, Any]) -> str | None:
        for rule in (self._rule_hemisphere, self._rule_capital, self._rule_region, self._rule_population,
                     self._rule_language, self._rule_country, self._rule_coast, self._rule_river,
                     self._rule_climate, self._rule_flags):
            result = rule(norm, c)
            if result is not None:
                return result
        return None

    @staticmethod
    def _yn(value: bool, yes: str, no: str) -> str:
        return ("Yes, " + yes) if value else ("No, " + no)

    def _rule_hemisphere(self, norm, c):
        match = re.search(r"\b(northern|southern|eastern|western)\s+hemisphere", norm)
        if not match:
            return None
        side = match.group(1)
        actual = c["hemisphere_ns"] if side in ("northern", "southern") else c["hemisphere_ew"]
        return self._yn(actual == side, f"it is in the {side} hemisphere.", f"it is in the {actual} hemisphere.")

    def _rule_region(self, norm, c):
        for phrase, regions in sorted(REGION_WORDS.items(), key=lambda kv: -len(kv[0])):
            if re.search(rf"\b{phrase}\b", norm):
                return self._yn(c["region"] in regions, f"the city is in {phrase.title()}.", f"the city is not in {phrase.title()}.")
        for phrase, continent in sorted(CONTINENT_WORDS.items(), key=lambda kv: -len(kv[0])):
            if re.search(rf"\b{phrase}\b", norm) and not re.search(r"\b(language|spoken|speak)\b", norm):
                if phrase == "australia" and c["country"] != "Australia" and c["continent"] == "Oceania":
                    continue
                return self._yn(c["continent"] == continent, f"the city is in {continent}.", f"the city is not in {continent}.")
        return None

    def _rule_capital(self, norm, c):
        if not re.search(r"\bcapital\b", norm):
            return None
        if re.search(r"\b(state|province|provincial|region|regional)\b", norm):
            return self._yn(bool(c.get("regional_capital")), "it is the capital of its state or province.", "it is not the capital of a state or province.")
        if re.search(r"\b(former|formerly|once|used to|ever|historic|historical)\b", norm):
            was = bool(c.get("former_national_capital")) or bool(c.get("national_capital"))
            return self._yn(was, "it has been a national capital.", "it has never been its country's capital.")
        return self._yn(bool(c.get("national_capital")), "it is the capital of its country.", "it is not the capital of its country.")

    def _rule_population(self, norm, c):
        match = re.search(r"\b(over|more than|above|at least|exceed\w*|greater than|less than|under|fewer than|below)\s+(\d+(?:\.\d+)?|\w+)\s*(million|thousand)", norm)
        if not match or not re.search(r"\b(population|people|inhabitants|residents|populous)\b", norm):
            if re.search(r"\b(largest|biggest|most populous)\b.*\b(city|cities)\b", norm) and re.search(r"\bcountry\b", norm):
                return self._yn(bool(c.get("largest_city_in_country")), "it is the largest city in its country.", "it is not the largest city in its country.")
            if re.search(r"\bmegacity\b", norm):
                return self._yn(c.get("metro_population_millions", 0) >= 10, "it is a megacity.", "it is not a megacity.")
            return None
        word, number, unit = match.groups()
        value = float(number) if re.fullmatch(r"\d+(?:\.\d+)?", number) else NUMBER_WORDS.get(number)
        if value is None:
            return None
        threshold = value if unit == "million" else value / 1000
        population = c.get("population_millions", 0)
        if re.search(r"\bmetro", norm):
            population = c.get("metro_population_millions", population)
        more = word in ("over", "more than", "above", "at least", "greater than") or word.startswith("exceed")
        truth = population > threshold if more else population < threshold
        return self._yn(truth, f"the city has about {population:g} million people.", f"the city has about {population:g} million people.")

    def _rule_language(self, norm, c):
        if not re.search(r"\b(language|speak|spoken|speaking|official)\b", norm):
            return None
        asked = self.language_index.find(norm)
        if not asked:
            return None
        def names(asked_lang: tuple[str, ...], lang: str) -> bool:  # "Arabic" names "Egyptian Arabic"
            words = stem_tokens(lang)
            return asked_lang == words or asked_lang == words[-len(asked_lang):]

        langs = c["languages"]
        if re.search(r"\b(primary|main|official|predominant|most common|mainly|mostly|first|majority|dominant)\b", norm):
            langs = langs[:1]
        truth = any(names(a, lang) for a in asked for lang in langs)
        return self._yn(truth, f"{c['languages'][0]} is the main language there.", f"the main language there is {c['languages'][0]}.")

    def _rule_country(self, norm, c):
        asked = self.country_index.find(norm)
        if not asked:
            return None
        truth = any(self.countries.get(a) == c["country"] for a in asked)
        name = " ".join(asked[0]).title()
        return self._yn(truth, f"the city is in {c['country']}.", f"the city is not in {name}.")

    def _rule_coast(self, norm, c):
        if re.search(r"\b(coast|coastal|ocean|sea|seaside|beach|beaches|seaport|port city|bay|gulf)\b", norm):
            if re.search(r"\bport\b", norm) and not re.search(r"\b(coast|ocean|sea)\b", norm):
                return self._yn(bool(c.get("port")), "it is a major port.", "it is not a major port.")
            return self._yn(bool(c.get("coastal")), f"it is on the coast{' of the ' + c['sea'] if c.get('sea') else ''}.", "it is not on the coast.")
        if re.search(r"\bport\b", norm):
            return self._yn(bool(c.get("port")), "it is a major port.", "it is not a major port.")
        return None

    def _rule_river(self, norm, c):
        if not re.search(r"\brivers?\b", norm):
            return None
        rivers = c.get("rivers") or []
        asked = self.river_index.find(norm)
        if asked:
            truth = any(a in {stem_tokens(r) for r in rivers} for a in asked)
            return self._yn(truth, "that river flows through it.", "that river does not flow through it.")
        return self._yn(bool(rivers), f"the {rivers[0]} flows through it." if rivers else "", "no major river flows through it.")

    def _rule_climate(self, norm, c):
        tags = {stem_tokens(t) for t in c.get("climate_tags", [])}
        if re.search(r"\bsnow", norm):
            truth = stem_tokens("snowy") in tags or stem_tokens("cold winters") in tags
            return self._yn(truth, "it can snow there in winter.", "it rarely if ever snows there.")
        if re.search(r"\b(climate|weather|hot|cold|warm|humid|dry|rainy|rain|tropical|desert|arid|temperate|mild|monsoon|seasons)\b", norm):
            asked = self.climate_index.find(norm)
            if not asked:
                return f"No, it has a {c['climate']}." if re.search(r"\bcold\b", norm) else None
            truth = any(a in tags for a in asked)
            return self._yn(truth, f"it has a {c['climate']}.", f"it has a {c['climate']}.")
        return None

    def _rule_flags(self, norm, c):
        flags = (
            (r"\b(olympic|olympics)\b", "olympics_host", "it has hosted the Olympic Games.", "it has not hosted the Olympics."),
            (r"\b(ancient|old city|history|historic|historical|centuries old|thousand years)\b", "ancient", "it has a long history.", "it is a relatively young city."),
            (r"\b(altitude|elevation|mountains|mountainous|highlands|plateau)\b", "high_altitude", "it lies at a high altitude.", "it is not at a high altitude."),
            (r"\b(financial|finance|business hub|economic hub|banking)\b", "financial_center", "it is a financial centre.", "it is not a major financial centre."),
            (r"\b(tourist|tourists|tourism|visitors)\b", "tourist_destination", "it is a popular tourist destination.", "it is not a major tourist destination."),
            (r"\b(sports? teams?|football club|soccer club|professional)\b", "sports_teams", "it has well-known sports teams.", "it is not known for its sports teams."),
        )
        for pattern, key, yes, no in flags:
            if re.search(pattern, norm):
                return self._yn(bool(c.get(key)), yes, no)
        if re.search(r"\b(famous|known|landmark|home to|have a|has a|island)\b", norm):
            # Content words of the question found in what the city is known for.
            known = " ".join(c.get("famous_for", []) + c.get("landmarks", []) + [c.get("description", "")])
            known_stems = set(stem_tokens(known))
            asked = [w for w in stem_tokens(norm) if len(w) > 3 and w not in _QUESTION_WORDS]
            if asked:
                return self._yn(any(w in known_stems for w in asked), "it is known for that.", "it is not particularly known for that.")
        return None
