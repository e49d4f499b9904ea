"""Realistic data for the intention-space benchmark: Guess My City games rendered from the fact tables.

The synthetic case of ``intention_sweep.py`` draws vectors around planted centres, so k-means
converges in a few iterations and every criterion finds the planted k. Real utterance embeddings
have no such structure. This module writes games whose texts look like an LLM's questions and an
oracle's answers, so that their sentence embeddings (the embedded all-MiniLM-L6-v2) are as hard
to cluster as real ones:

* **Questions** come from paraphrase templates over every fact family of
  ``dataset/guess_my_city_facts.json`` (continent, region, country, coast, rivers, capital,
  population thresholds, language, religion, currency, climate, landmarks, famous-for, ...), with
  several subjects ("your city", "the city you're thinking of", "your hometown"), LLM-style
  openers ("Great! ", "Based on that, ") and, now and then, a multi-line preamble before the
  question. Fillers come from the hidden city's facts half of the time, otherwise from a random
  city, so answers are a mix of yes and no.
* **Guesses** name a city; the chance of guessing grows with the turn, and a guess names the
  hidden city with a fixed probability, so about a third of the games are won.
* **Answers** are the knowledge-base oracle's answer to the extracted question, phrased in one
  of several ways ("Yes, ...", "Correct! ...", "Nope. ...").

Everything is drawn from one seeded generator: the same arguments give the same file.

    python benchmarks/realistic_games.py --games 950 --out /tmp/realistic.jsonl
"""
from __future__ import annotations

import argparse
import random
from typing import Any, Callable

from aria.games.common.base import load_game_config
from aria.games.question.game import load_game
from aria.games.question.oracle import build_oracle
from aria.io import read_json
from aria.resources import dataset_file
from aria.trajectories import make_record, write_trajectories

SUBJECTS = ["your city", "the city you're thinking of", "the city you are from", "your hometown", "this city",
            "the city", "the city in question", "your mystery city", "the city you have in mind", "your chosen city"]
# Openers either lower-case the question ("Okay, is ...") or stand as a sentence of their own.
OPENERS = ["Okay, ", "Based on that, ", "Hmm, ", "So, ", "Alright, ", "Then ", "In that case, ", "Next, ", "Now, ",
           "Following up, ", "Given that, ", "With that in mind, ", "Just to check, "]
SENTENCES = ["Great! ", "Thanks. ", "Interesting! ", "Got it. ", "Let me narrow it down. ", "Good to know. ",
             "That helps! ", "I see. ", "Thank you for the answer. ", "That's useful. ", "Noted. ", "Hmm. ",
             "That narrows it down. ", "Okay. ", "Alright. ", "Fascinating. "]
SUFFIXES = [" Just curious.", " This would help me narrow it down.", " I'm trying to narrow down the region.",
            " That would tell me a lot.", " Let me know!", " Thanks in advance.", " I have a hunch.",
            " That would rule out a lot of places.", " I'm getting closer, I think.", " Please answer yes or no."]
FOLLOW_UPS = [" Keep guessing!", " Good question.", " You're getting closer.", " Keep going.", " Try another question.",
              " Nice try.", " That's a good way to narrow it down.", " Ask me something else.", " You can do it!",
              " What else would you like to know?", " Keep the questions coming.", " You're on the right track."]
PREAMBLES = ["Based on the information provided, my next question would be:\n\n{q}",
             "Let me think about what we know so far.\n\n{q}",
             "Here is my next question:\n{q}",
             "We have ruled out a few places already. {q}",
             "Question: {q}\nThis should help me narrow things down."]
YES_FORMS = ["Yes, {s}", "Yes. {S}", "Correct, {s}", "That's right: {s}", "Yes! {S}", "Indeed, {s}"]
NO_FORMS = ["No, {s}", "No. {S}", "Nope, {s}", "That's not right: {s}", "Not quite. {S}", "Actually, {s}"]


def _cap(text: str) -> str:
    return text[:1].upper() + text[1:]


def _templates() -> list[tuple[list[tuple[str, str]], Callable[[dict], list[str]]]]:
    """Per fact family: (question, statement) template pairs with {subj}, {x}, {not}, and the fillers of a city.

    The statement is how an LLM oracle echoes the question in its answer ("No, the city is not
    located in Europe."); ``{not}`` becomes " not" in a no-answer.
    """
    return [
        ([("Is {subj} in {x}?", "{Subj} is{not} in {x}."), ("Is {subj} located in {x}?", "{Subj} is{not} located in {x}."),
          ("Would I find {subj} in {x}?", "You would{not} find {subj} in {x}."),
          ("Is {subj} on the continent of {x}?", "{Subj} is{not} on the continent of {x}."),
          ("Can {subj} be found in {x}?", "{Subj} can{not} be found in {x}."),
          ("Is {subj} somewhere in {x}?", "{Subj} is{not} somewhere in {x}."),
          ("Does {subj} lie in {x}?", "{Subj} does{not} lie in {x}.")], lambda c: [c["continent"], c["region"]]),
        ([("Is {subj} in {x}?", "{Subj} is{not} in {x}."), ("Is {subj} located in {x}?", "{Subj} is{not} located in {x}."),
          ("Is {subj} a city in {x}?", "{Subj} is{not} a city in {x}."),
          ("Is the country of {subj} {x}?", "The country is{not} {x}.")],
         lambda c: [c["country"], *c.get("country_aliases", [])[:1]]),
        ([("Is {subj} in the {x} hemisphere?", "{Subj} is{not} in the {x} hemisphere.")],
         lambda c: [c["hemisphere_ns"], c["hemisphere_ew"]]),
        ([("Is {subj} on the coast?", "{Subj} is{not} on the coast."), ("Is {subj} a coastal city?", "{Subj} is{not} a coastal city."),
          ("Does {subj} have a beach?", "{Subj} does{not} have a beach."), ("Is {subj} by the sea?", "{Subj} is{not} by the sea.")],
         lambda c: [""]),
        ([("Is {subj} on the {x}?", "{Subj} is{not} on the {x}."), ("Is {subj} located near the {x}?", "{Subj} is{not} near the {x}.")],
         lambda c: [c["sea"]] if c.get("sea") else []),
        ([("Does the {x} flow through {subj}?", "The {x} does{not} flow through {subj}."),
          ("Is {subj} built along the {x}?", "{Subj} is{not} built along the {x}.")], lambda c: c.get("rivers", [])),
        ([("Is {subj} on a river?", "{Subj} is{not} on a major river.")], lambda c: [""]),
        ([("Is {subj} the capital of its country?", "{Subj} is{not} the capital of its country."),
          ("Is {subj} a national capital?", "{Subj} is{not} a national capital."),
          ("Is {subj} the capital of a state or province?", "{Subj} is{not} the capital of a state or province.")], lambda c: [""]),
        ([("Does {subj} have a population of over {x} million people?", "{Subj} does{not} have more than {x} million people."),
          ("Are there more than {x} million people in {subj}?", "There are{not} more than {x} million people in {subj}."),
          ("Is the population of {subj} less than {x} million?", "The population of {subj} is{not} below {x} million.")],
         lambda c: [str(n) for n in (0.5, 1, 1.5, 2, 2.5, 3, 4, 5, 6, 7, 8, 10, 12, 15, 20, 25, 30)]),
        ([("Is {x} the main language spoken in {subj}?", "{X} is{not} the main language of {subj}."),
          ("Do people in {subj} speak {x}?", "People in {subj} do{not} mainly speak {x}."),
          ("Is the official language of {subj} {x}?", "The official language of {subj} is{not} {x}.")], lambda c: c["languages"]),
        ([("Is {x} the main religion in {subj}?", "{X} is{not} the main religion in {subj}.")],
         lambda c: [r for r in c.get("religions", []) if "(" not in r]),
        ([("Is the {x} used in {subj}?", "The {x} is{not} used in {subj}.")], lambda c: [c["currency"]] if c.get("currency") else []),
        ([("Does {subj} have a {x} climate?", "{Subj} does{not} have a {x} climate."),
          ("Is the weather in {subj} {x}?", "The weather in {subj} is{not} {x}."),
          ("Does {subj} have {x}?", "{Subj} does{not} have {x}.")], lambda c: c.get("climate_tags", [])),
        ([("Does it snow in {subj}?", "It does{not} snow in {subj}."), ("Is {subj} cold in winter?", "{Subj} is{not} cold in winter.")],
         lambda c: [""]),
        ([("Is {subj} home to the {x}?", "{Subj} is{not} home to the {x}."),
          ("Can you visit the {x} in {subj}?", "You can{not} visit the {x} in {subj}.")], lambda c: c.get("landmarks", [])),
        ([("Is {subj} known for {x}?", "{Subj} is{not} known for {x}."), ("Is {subj} famous for {x}?", "{Subj} is{not} famous for {x}.")],
         lambda c: c.get("famous_for", [])),
        ([("Has {subj} hosted the Olympics?", "{Subj} has{not} hosted the Olympic Games."),
          ("Is {subj} a financial centre?", "{Subj} is{not} a major financial centre."),
          ("Is {subj} a popular tourist destination?", "{Subj} is{not} a major tourist destination."),
          ("Does {subj} have professional sports teams?", "{Subj} does{not} have well-known sports teams."),
          ("Is {subj} an ancient city?", "{Subj} is{not} an ancient city."),
          ("Is {subj} at a high altitude?", "{Subj} is{not} at a high altitude."),
          ("Is {subj} a major port?", "{Subj} is{not} a major port."),
          ("Is {subj} the largest city in its country?", "{Subj} is{not} the largest city in its country.")], lambda c: [""]),
        ([("What is the primary language spoken in {subj}?", ""), ("What continent is {subj} on?", ""),
          ("What is the climate like in {subj}?", ""), ("What is {subj} famous for?", ""),
          ("Which river flows through {subj}?", ""), ("What currency is used in {subj}?", "")], lambda c: [""]),
    ]


def _guess(city: str, country: str, rng: random.Random) -> str:
    forms = ["Is {subj} {city}?", "Is it {city}?", "Are you thinking of {city}?", "Is {subj} {city}, {country}?",
             "My guess is {city}. Is that right?", "Could {subj} be {city}?"]
    return rng.choice(forms).format(subj=rng.choice(SUBJECTS), city=city, country=country)


ANSWER_SUBJECTS = ["my city", "the city", "it", "the city I am thinking of", "my hometown", "this city",
                   "the city I have in mind", "the city I'm from", "the mystery city"]


def _answer(kb_answer: str, statement: str, fact_true: bool | None, rng: random.Random) -> str:
    """An LLM oracle's phrasing of the knowledge base's verdict (see the module doc).

    Where the knowledge base cannot parse a question that has a filler, the verdict is whether
    the filler is one of the hidden city's facts (``fact_true``).
    """
    verdict = kb_answer.split(" ", 1)[0].rstrip(",.!").lower()
    if verdict not in ("yes", "no") and statement and fact_true is not None:
        verdict, kb_answer = ("yes", "Yes.") if fact_true else ("no", "No.")
    if verdict not in ("yes", "no"):
        return kb_answer  # an open answer, "I'm not sure ..." or the invalid-question line
    if statement and rng.random() < 0.75:
        subject = rng.choice(ANSWER_SUBJECTS)
        body = statement.replace("{not}", "" if verdict == "yes" else " not").format(Subj=_cap(subject), subj=subject)
        body = body.replace("can not", "cannot")
        extra = " " + _cap(kb_answer.split(" ", 1)[1]) if rng.random() < 0.3 and " " in kb_answer else ""
        answer = rng.choice(YES_FORMS if verdict == "yes" else NO_FORMS).format(s=body[0].lower() + body[1:], S=body) + extra
    else:
        answer = kb_answer
    return answer + (rng.choice(FOLLOW_UPS) if rng.random() < 0.4 else "")


def realistic_games(num_games: int = 950, max_turns: int = 20, seed: int = 0, guess_right: float = 0.1) -> list[dict]:
    """Guess My City games as schema-v1 records (see the module doc)."""
    rng = random.Random(seed)
    game_cfg = load_game_config("guess_my_city")
    game = load_game("guess_my_city")
    oracle = build_oracle({"name": "knowledge_base"}, game_cfg)
    facts: dict[str, dict[str, Any]] = read_json(dataset_file(game_cfg["facts_file"]))["cities"]
    families = _templates()
    names = [t.name for t in game.targets]
    records = []
    for g in range(num_games):
        target = names[(g * 37 + seed) % len(names)]
        turns, won = [], False
        for t in range(max_turns):
            statement, fact_true = "", None
            if rng.random() < 0.01 + 0.017 * t:
                city = target if rng.random() < guess_right else rng.choice(names)
                question = core = _guess(city, facts[city]["country"], rng)
            else:
                pairs, values = rng.choice(families)
                source = facts[target] if rng.random() < 0.5 else facts[rng.choice(names)]
                while not (fillers := values(source)):  # a city without a sea or a river: draw another
                    source = facts[rng.choice(names)]
                x = rng.choice(fillers)
                template, statement = rng.choice(pairs)
                question = core = template.format(subj=rng.choice(SUBJECTS), x=x)
                fact_true = x in values(facts[target]) if x else None
                roll = rng.random()
                if roll < 0.3:
                    question = rng.choice(OPENERS) + question[0].lower() + question[1:]
                elif roll < 0.6:
                    question = rng.choice(SENTENCES) + question
                if rng.random() < 0.2:
                    question += rng.choice(SUFFIXES)
                statement = statement.replace("{x}", x).replace("{X}", _cap(x))
            action = rng.choice(PREAMBLES).format(q=question) if rng.random() < 0.05 else f"Question: {question}"
            asked = game.extract_question(action)
            win = game.is_win(asked, target)
            # The oracle answers the question without the opener (an LLM oracle would understand it).
            answer = game.win_answer if win else _answer(oracle.answer_one(target, core), statement, fact_true, rng)
            turns.append({"action": action, "question": asked, "observation": answer, "reward": 0.0 if win else -1.0})
            if win:
                won = True
                break
        records.append(make_record(game_id=f"realistic-{g:05d}", game="guess_my_city", target=target, turns=turns,
                                   success=won, model="scripted-paraphrase", oracle="knowledge_base", seed=seed,
                                   source="benchmark"))
    return records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--games", type=int, default=950)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    records = realistic_games(args.games, seed=args.seed)
    write_trajectories(args.out, records)
    questions = {t["action"] for r in records for t in r["turns"]}
    answers = {t["observation"] for r in records for t in r["turns"]}
    steps = sum(len(r["turns"]) for r in records)
    print(f"{len(records)} games, {steps} steps, {sum(r['success'] for r in records)} won; "
          f"{len(questions)} distinct questions + {len(answers)} distinct answers = {len(questions) + len(answers)}")


if __name__ == "__main__":
    main()
