"""The fine-tuning task: pull a person's name, age, city and job out of a sentence into strict JSON.

A task the embedded SmolLM2-135M-Instruct mostly fails (it answers in prose, wraps JSON in code fences,
invents keys or copies the wrong city) and that a small adapter can learn. The data is generated here,
deterministically from a seed, and shipped in ``data/finetune/`` (train, validation and test JSONL files, each
line ``{"prompt": ..., "answer": ...}``); a test regenerates it and compares. Sentences vary in word order and
phrasing and carry distractors (a second city, a second number, a second person's job), so copying the first
city or number is not enough. The splits share no person (full name): the test items are unseen in training.

:func:`score` compares a reply with the answer: ``exact`` when the reply, stripped, is the answer string, and
``match`` when the first ``{...}`` in the reply parses as JSON and equals the answer's object (the more lenient
of the two, and the one the targets use, so the base model is not failed for spacing alone).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

INSTRUCTION = "Extract the person's name, age, city and job from the text as JSON with keys name, age, city, job."
SPLITS = {"train": 1200, "validation": 100, "test": 250}
SEED = 18

FIRST = """Maria James Aiko Omar Lena Tomas Priya Kwame Sofia Daniel Ingrid Mateo Yuki Fatima Lucas Chloe Arjun Nadia
Felix Amara Hugo Elena Ravi Zara Noah Mira Ivan Leila Oscar Hana Diego Greta Samir Alice Kofi Nina Pablo Sara Emil Ayesha
Viktor Lucia Kenji Rosa Theo Imani Marco Julia Anders Mei""".split()
LAST = """Lopez Okafor Tanaka Haddad Novak Silva Sharma Mensah Rossi Becker Larsen Garcia Sato Khan Dubois Martin Patel
Petrova Weber Diallo Moreau Kowalski Iyer Nakamura Fischer Costa Ivanova Hansen Ortiz Yamamoto Schmidt Boateng Ferreira
Jensen Mahmoud Romano Lindqvist Kim Nguyen Alvarez""".split()
CITIES = """Lisbon Nairobi Osaka Toronto Krakow Lima Dublin Accra Porto Seoul Oslo Cairo Denver Munich Hanoi Bogota Perth
Leeds Quito Tunis Bergen Turin Austin Lyon Cork Dakar Kyoto Malmo Gdansk Valencia Adelaide Halifax Mumbai Tallinn Riga
Zagreb Sapporo Boston Nantes Seville Graz Leipzig Bilbao Cusco Manila Hobart Aarhus Geneva Ghent Busan""".split()
JOBS = [
    "nurse",
    "teacher",
    "plumber",
    "architect",
    "pilot",
    "chef",
    "lawyer",
    "baker",
    "dentist",
    "farmer",
    "librarian",
    "electrician",
    "journalist",
    "pharmacist",
    "engineer",
    "painter",
    "carpenter",
    "translator",
    "firefighter",
    "accountant",
    "veterinarian",
    "photographer",
    "mechanic",
    "designer",
    "biologist",
    "tailor",
    "surgeon",
    "bus driver",
    "data analyst",
    "game developer",
    "flight attendant",
    "social worker",
    "sound engineer",
    "tour guide",
    "web developer",
    "police officer",
    "music teacher",
    "taxi driver",
    "lab technician",
    "florist",
]
RELATIVES = ["sister", "brother", "cousin", "neighbour", "friend", "colleague"]

# {n} name, {a} age, {c} city, {j} job; distractors: {c2} another city, {k} another number, {j2} another job, {r} a relative
TEMPLATES = [
    "{n} is a {a}-year-old {j} who lives in {c}.",
    "{n}, {a}, works as a {j} in {c}.",
    "Meet {n}: {j}, {a} years old, based in {c}.",
    "In {c}, {n} has worked as a {j} for {k} years; {n_first} is {a} now.",
    "{n} grew up in {c2} but moved to {c}, where the {a}-year-old works as a {j}.",
    "At {a}, {n} is a {j} living in {c}, although {n_first}'s {r} is a {j2} in {c2}.",
    "Our new {j} is {n} ({a}), who commutes every day in {c}.",
    "{n} ({a}) left {c2} last year and now works in {c} as a {j}.",
    "Age {a}, home {c}, job {j}: that is {n} in a nutshell.",
    "The {j} {n}, aged {a}, lives in {c} with {k} cats.",
    "After {k} years in {c2}, {n} settled in {c}; the {a}-year-old {j} loves it there.",
    "{n} turned {a} this spring and still works as a {j} in {c}.",
    "Working as a {j} in {c} keeps {n}, {a}, busy.",
    "{n} from {c} is {a} and a {j}; {n_first}'s {r} is {k}.",
    "Profile: {n}. Lives in {c}. {a} years old. Occupation: {j}.",
    "Although {n}'s {r} works as a {j2}, {n} chose to be a {j} and lives in {c} at {a}.",
    "{n} is {a}, works in {c} as a {j}, and visits {c2} every summer.",
    "Everyone in {c} knows {n}, the {a}-year-old {j}.",
    "Born {a} years ago, {n} is now a {j} in {c}.",
    "{n}, a {j} aged {a}, flew from {c2} back home to {c}.",
]


@dataclass(frozen=True)
class Example:
    prompt: str  # the user's message (instruction and text); the chat template is applied when training
    answer: str  # the assistant's reply: one line of JSON

    def to_json(self) -> dict:
        return {"prompt": self.prompt, "answer": self.answer}


def answer_json(name: str, age: int, city: str, job: str) -> str:
    return json.dumps({"name": name, "age": age, "city": city, "job": job})


def _example(rng: random.Random, first: str, last: str) -> Example:
    template = rng.choice(TEMPLATES)
    city, city2 = rng.sample(CITIES, 2)
    job, job2 = rng.sample(JOBS, 2)
    age = rng.randint(19, 79)
    other = rng.choice([k for k in range(2, 40) if k != age])
    text = template.format(
        n=f"{first} {last}", n_first=first, a=age, c=city, c2=city2, j=job, j2=job2, k=other, r=rng.choice(RELATIVES)
    )
    text = text.replace(" a a", " an a").replace(" a e", " an e").replace(" a o", " an o").replace(" a i", " an i")
    return Example(f"{INSTRUCTION}\n\nText: {text}", answer_json(f"{first} {last}", age, city, job))


def generate(seed: int = SEED, sizes: dict[str, int] = SPLITS) -> dict[str, list[Example]]:
    """The splits, each person (full name) in one split only."""
    rng = random.Random(seed)
    people = [(f, s) for f in FIRST for s in LAST]
    rng.shuffle(people)
    need = sum(sizes.values())
    if need > len(people):
        raise ValueError(f"{need} examples need {need} distinct people; there are {len(people)}")
    out, at = {}, 0
    for split, n in sizes.items():
        out[split] = [_example(rng, *people[at + i]) for i in range(n)]
        at += n
    return out


def parse_reply(reply: str) -> dict | None:
    """The first ``{...}`` of a reply as a JSON object, or None."""
    start = reply.find("{")
    end = reply.find("}", start)
    if start < 0 or end < 0:
        return None
    try:
        value = json.loads(reply[start : end + 1])
    except json.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


#: The answer's JSON schema: the constraint structured output decodes with (``jaxlab bench --structured``).
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "city": {"type": "string"},
        "job": {"type": "string"},
    },
    "required": ["name", "age", "city", "job"],
    "additionalProperties": False,
}
FIELDS = tuple(SCHEMA["properties"])


def schema_valid(reply: str) -> bool:
    """The whole reply is one JSON object with exactly :data:`SCHEMA`'s keys, each of its type."""
    try:
        value = json.loads(reply)
    except json.JSONDecodeError:
        return False
    if not isinstance(value, dict) or set(value) != set(FIELDS):
        return False
    age = value["age"]
    strings = all(isinstance(value[k], str) for k in ("name", "city", "job"))
    return strings and isinstance(age, int) and not isinstance(age, bool)


def fields_exact(reply: str, answer: str) -> float:
    """The fraction of the answer's fields the reply's first JSON object has exactly (0 when it has none)."""
    got, want = parse_reply(reply) or {}, json.loads(answer)
    return sum(got.get(k) == v for k, v in want.items()) / len(want)


def score(reply: str, answer: str) -> dict[str, bool]:
    """{"exact": the stripped reply is the answer, "match": its JSON object equals the answer's}."""
    return {"exact": reply.strip() == answer, "match": parse_reply(reply) == json.loads(answer)}
