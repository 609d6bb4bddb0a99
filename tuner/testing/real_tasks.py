"""The checkable task file for the trained model (issue 58): arithmetic, capitals, unit conversions and short
facts, each with a regex answer, in the quality check's task format (`tuner/quality/tasks.py`).

Why generated: the items are simple enough that a 135M instruct model gets many of them right, and exact
enough that a regex decides each one; writing them from tables keeps the file reviewable and the same every
time. The task check sends `prompt` to the completions API as it is, so each prompt carries SmolLM2's chat
template already rendered (its ChatML, with the template's default system line), as `vllm serve` would
render a chat request.

    python -m tuner.testing.real_tasks OUT.jsonl
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"

CAPITALS = {
    "France": "Paris", "Germany": "Berlin", "Italy": "Rome", "Spain": "Madrid", "Japan": "Tokyo",
    "China": "Beijing", "Russia": "Moscow", "the United Kingdom": "London", "Canada": "Ottawa",
    "Australia": "Canberra", "Egypt": "Cairo", "Greece": "Athens", "Portugal": "Lisbon", "Ireland": "Dublin",
    "Norway": "Oslo", "Sweden": "Stockholm", "Finland": "Helsinki", "Denmark": "Copenhagen", "Poland": "Warsaw",
    "Austria": "Vienna", "the Netherlands": "Amsterdam", "Belgium": "Brussels", "Argentina": "Buenos Aires",
    "Peru": "Lima", "Kenya": "Nairobi", "India": "New Delhi", "Thailand": "Bangkok", "South Korea": "Seoul",
    "Turkey": "Ankara", "Hungary": "Budapest",
}

FACTS = [
    ("How many days are in a week?", r"\b(7|seven)\b"),
    ("How many months are in a year?", r"\b(12|twelve)\b"),
    ("How many hours are in a day?", r"\b(24|twenty-four)\b"),
    ("How many legs does a spider have?", r"\b(8|eight)\b"),
    ("How many sides does a triangle have?", r"\b(3|three)\b"),
    ("How many sides does a hexagon have?", r"\b(6|six)\b"),
    ("What is the largest planet in our solar system?", r"(?i)jupiter"),
    ("Which planet is known as the Red Planet?", r"(?i)mars"),
    ("What is the chemical formula of water?", r"H2O|H₂O"),
    ("At how many degrees Celsius does water freeze?", r"(?<![0-9.])0(?![0-9])|(?i:zero)"),
    ("At how many degrees Celsius does water boil at sea level?", r"(?<![0-9])100(?![0-9])"),
    ("Who wrote Romeo and Juliet?", r"(?i)shakespeare"),
    ("What colour is the sky on a clear day?", r"(?i)blue"),
    ("What is the opposite of hot?", r"(?i)cold"),
    ("What gas do plants take in from the air to make food?", r"(?i)carbon dioxide|CO2"),
]


def number(n: int) -> str:
    """A regex for the integer n, not as part of a longer number (commas allowed: 1,000)."""
    text = f"{n:,}".replace(",", ",?")
    return rf"(?<![0-9]){text}(?![0-9])"


def chat(question: str) -> str:
    return (f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{question}<|im_end|>\n"
            "<|im_start|>assistant\n")


def tasks() -> list[dict]:
    items: list[tuple[str, str]] = []
    for a, b in [(2, 3), (4, 5), (7, 8), (6, 9), (12, 5), (15, 4), (9, 9), (13, 7), (20, 11), (18, 6),
                 (25, 25), (31, 12), (44, 16), (50, 50), (63, 21), (8, 17), (3, 14), (11, 19), (27, 8), (40, 35)]:
        items.append((f"What is {a} plus {b}?", number(a + b)))
    for a, b in [(2, 3), (4, 5), (3, 7), (6, 6), (8, 4), (9, 3), (7, 7), (5, 9), (10, 10), (12, 3),
                 (11, 4), (6, 8), (17, 3), (9, 9), (2, 50)]:
        items.append((f"What is {a} times {b}?", number(a * b)))
    for a, b in [(10, 3), (20, 5), (15, 8), (100, 1), (9, 4), (50, 20), (30, 12), (17, 9), (64, 32), (45, 15)]:
        items.append((f"What is {a} minus {b}?", number(a - b)))
    for country, city in CAPITALS.items():
        items.append((f"What is the capital of {country}?", rf"(?i){city}"))
    for n in (2, 3, 5, 10):
        items.append((f"How many minutes are in {n} hours?", number(n * 60)))
        items.append((f"How many meters are in {n} kilometers?", number(n * 1000)))
        items.append((f"How many centimeters are in {n} meters?", number(n * 100)))
        items.append((f"How many seconds are in {n} minutes?", number(n * 60)))
    items.extend(FACTS)
    return [{"prompt": chat(q), "regex": rx, "max_tokens": 32} for q, rx in items]


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m tuner.testing.real_tasks OUT.jsonl", file=sys.stderr)
        return 2
    Path(argv[0]).write_text("".join(json.dumps(t) + "\n" for t in tasks()))
    print(f"{len(tasks())} tasks -> {argv[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
