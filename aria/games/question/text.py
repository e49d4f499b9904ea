"""Text utilities shared by the games and oracles: normalisation and whole-phrase matching.

Whole-phrase matching is the win rule of both single-agent games (docs/method.md §6): a question wins when
it *names* the target as a phrase, not when the target's letters appear somewhere ("Is it in
California?" does not name Cali) and not only by its last word (the original's rule, which made
seven two-word Twenty Questions objects unwinnable).
"""
from __future__ import annotations

import functools
import re
import unicodedata
from dataclasses import dataclass, field

_NON_ALNUM = re.compile(r"[^a-z0-9]+")
# Quote marks folded to ASCII before matching, so "Xi’an" and "Xi'an" are the same name.
_QUOTES = str.maketrans({"\u2018": "'", "\u2019": "'", "\u201a": "'", "\u201b": "'", "\u2032": "'", "`": "'",
                         "\u201c": '"', "\u201d": '"', "\u201e": '"', "\u00ab": '"', "\u00bb": '"'})


@functools.lru_cache(maxsize=1 << 16)
def normalize(text: str) -> str:
    """Lower-case, strip accents, turn every non-alphanumeric run into one space.

    ``"São Paulo's"`` -> ``"sao paulo s"``; ``"Xi'an"`` -> ``"xi an"``. Cached: an oracle and the
    scripted expert normalise the same questions and names once per target (1.4 million calls,
    30 of 53 s, for the expert's 12 Twenty Questions games before).
    """
    return _NON_ALNUM.sub(" ", fold(text).lower()).strip()


def fold(text: str) -> str:
    """Strip accents and fold typographic quotes: ``"Bogotá’s"`` -> ``"Bogota's"`` (case kept)."""
    text = unicodedata.normalize("NFKD", text.translate(_QUOTES))
    return unicodedata.normalize("NFC", "".join(ch for ch in text if not unicodedata.combining(ch)))


def tokens(text: str) -> list[str]:
    return normalize(text).split()


def _plural_forms(word: str) -> tuple[str, ...]:
    forms = [word, word + "s", word + "es"]
    if word.endswith("y") and len(word) > 2:
        forms.append(word[:-1] + "ies")
    return tuple(forms)


@dataclass
class PhraseIndex:
    """Finds named phrases in text, longest match first, each text position used once.

    Each phrase maps to a key (e.g. all aliases of an object map to its canonical name). The
    last word of a phrase also matches its plural ("cats" names Cat). Longest match first means
    "Is it a pencil eraser?" names Eraser (alias "Pencil eraser"), not Pencil, and "Is it a
    baseball bat?" names Baseball bat, not Baseball.
    """

    _by_first: dict[str, list[tuple[tuple[str, ...], str]]] = field(default_factory=dict)

    @classmethod
    def build(cls, phrases: dict[str, str]) -> "PhraseIndex":
        index = cls()
        for phrase, key in phrases.items():
            words = tuple(tokens(phrase))
            if not words:
                raise ValueError(f"empty phrase for key {key!r}")
            index._by_first.setdefault(words[0], []).append((words, key))
            if len(words) == 1:
                for form in _plural_forms(words[0])[1:]:
                    index._by_first.setdefault(form, []).append(((form,), key))
        for entries in index._by_first.values():
            entries.sort(key=lambda item: -len(item[0]))
        return index

    def find(self, text: str) -> list[str]:
        """Keys of every phrase named in ``text``, in order of appearance."""
        words = tokens(text)
        found: list[str] = []
        i = 0
        while i < len(words):
            match = None
            for phrase, key in self._by_first.get(words[i], ()):
                n = len(phrase)
                window = words[i : i + n]
                if len(window) == n and all(
                    w == p or (j == n - 1 and w in _plural_forms(p)) for j, (w, p) in enumerate(zip(window, phrase))
                ):
                    match = (n, key)
                    break
            if match:
                found.append(match[1])
                i += match[0]
            else:
                i += 1
        return found


def contains_phrase(text: str, phrase: str) -> bool:
    """True when ``phrase`` occurs in ``text`` as whole words (after :func:`normalize`)."""
    needle = normalize(phrase)
    return bool(needle) and f" {needle} " in f" {normalize(text)} "


# ---- the agent's question in a model output -----------------------------------------------
# "Question:", "question 3:", "**Question:**", "my next question is:" / "would be:" (the marker the
# prompts ask for, and the ways models announce it; the last one counts).
_MARKER = re.compile(r"\bquestion(?:\s*#?\s*\d+|\s+(?:is|would be|will be))?\s*\**\s*[:\uff1a]", re.IGNORECASE)
# A sentence ends at . ! ? (with closing quotes or brackets) followed by white space.
_SENTENCE_END = re.compile(r"[.!?]+[\"'*)\]]*\s+")
# "St. Petersburg", "U.S. or Canada", "e.g. Paris": a full stop that ends an abbreviation, not a sentence.
_ABBREVIATION = re.compile(r"(?:\b(?:[A-Za-z]\.){1,3}|\b(?:st|mt|ft|mr|mrs|ms|dr|jr|sr|vs|etc|approx|no)\.)$", re.IGNORECASE)
_QUOTED_QUESTION = re.compile(r"[\"\u201c]([^\"\u201c\u201d\n]{2,}?\?)[\"\u201d]")
_LINE_DECORATION = re.compile(r"^\s*(?:[-*\u2022>]+|\d+[.)]|\(?[a-z]\))\s+|^\s*[*_]+\s*", re.IGNORECASE)
_EDGE = "\"'*_ \t\u201c\u201d"


def _sentences(line: str) -> list[str]:
    """The sentences of one line (see :data:`_SENTENCE_END`; abbreviations do not end one)."""
    out, start = [], 0
    for match in _SENTENCE_END.finditer(line):
        head = line[start : match.start() + 1]
        if match.group().startswith(".") and _ABBREVIATION.search(head):
            continue
        out.append(line[start : match.end()].strip())
        start = match.end()
    out.append(line[start:].strip())
    return [s for s in out if s]


def _clean(text: str) -> str:
    return _LINE_DECORATION.sub("", text).strip(_EDGE)


def _is_question(sentence: str) -> bool:
    return sentence.rstrip(_EDGE + ")]").endswith("?")


def _last_question_run(line: str) -> str | None:
    """The last run of consecutive sentences ending in '?' in one line ("Is it big? Like, really big?")."""
    sentences = _sentences(line)
    end = max((i for i, s in enumerate(sentences) if _is_question(s)), default=None)
    if end is None:
        quoted = _QUOTED_QUESTION.findall(line)  # I would ask "Is it a fruit?" next.
        return quoted[-1].strip() if quoted else None
    start = end
    while start > 0 and _is_question(sentences[start - 1]):
        start -= 1
    run = " ".join(sentences[start : end + 1])
    quoted = _QUOTED_QUESTION.findall(run)  # I would ask "Is it a fruit?"
    return quoted[-1].strip() if quoted and not run.lstrip(_EDGE).startswith(quoted[-1]) else _clean(run)


def extract_question(output: str | None, max_chars: int = 300) -> str | None:
    """The question in a model's output, for play and for import alike (one rule everywhere).

    1. With a ``Question:`` marker (any case, numbered or in bold, or "my question is:" /
       "would be:"), only the text after the *last* marker counts (the original's rule). Its
       first non-empty line is the question when it holds a '?': the last run of sentences
       ending in '?' in it, so a leading remark ("Thanks. ") and a trailing one ("... This
       helps.") are dropped.
    2. Otherwise (no marker, or a marker followed by a preamble), the question is the last run of
       sentences ending in '?' on the last line that has one, or failing that the last quoted
       question (I'd ask "Is it red?").
    3. Otherwise a marker's first non-empty line is taken as it is (a statement the oracle will
       answer as invalid), and an output with neither a marker nor a '?' has no question.

    Bullets, list numbers, bold and surrounding quotes are stripped. ``None`` also for an empty
    question or one longer than ``max_chars`` characters (a model that rambles).
    Tested on a table of real-looking outputs in ``tests/test_games.py``.
    """
    text = (output or "").replace("\r\n", "\n").replace("\r", "\n")
    markers = list(_MARKER.finditer(text))
    tail = text[markers[-1].end():] if markers else text
    lines = [line for line in (_clean(raw) for raw in tail.split("\n")) if line]
    question = None
    if markers and lines and "?" in lines[0]:
        question = _last_question_run(lines[0])
    if question is None:
        for line in reversed(lines):
            if (question := _last_question_run(line)) is not None:
                break
    if question is None and markers and lines:
        question = lines[0]
    if not question or len(question) > max_chars:
        return None
    return question
