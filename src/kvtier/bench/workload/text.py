"""Deterministic text sized in tokens, without a tokenizer.

The driver runs against any server, so it cannot count tokens with the server's tokenizer. It
writes text from short, common, lower-case English words, each preceded by a space: in the
byte-pair vocabularies of the usual model families (GPT-2 style, Llama, Qwen, SmolLM) such a
word is one token, and so is a full stop, so ``n`` words and full stops come to about ``n``
tokens (exactly ``n`` with SmolLM2's tokenizer). The results report the server's own count,
``usage.prompt_tokens``. A full stop after every twelfth word keeps the text from being one
endless run-on.

The same seed gives the same text. Texts of different seeds share no leading block in practice:
each starts with a tag naming what it is (``doc 17``, ``user 3``), and the words after it differ.
"""

import random

#: One-token words (with their leading space) in common BPE vocabularies. Written for this
#: project; any list of short frequent words would do.
_PARAGRAPH = (
    "the a an and or but if then so as at by for from in into of on to with over under "
    "after before about around near far up down out off here there now soon still just "
    "very more most less much many few some any each every all both other same new old "
    "good great small large long short high low big little young early late hard easy "
    "red blue green black white gold dark light warm cold hot dry wet clear full soft "
    "day night year week month time hour world life hand part place case point home room "
    "water fire air earth stone wood road river sea hill field tree city town house door "
    "book word name line story song game team group party class school work job plan "
    "man woman child friend king queen father mother son girl boy family people state "
    "land lord law war peace power money price cost market trade bank store shop food "
    "bread milk fish bird dog cat horse cow sheep rice tea wine salt sugar fruit apple "
    "car ship train plane boat bus wheel engine metal glass paper cloth rope box bag cup "
    "make take give keep find show tell ask call come go get put set run walk turn move "
    "play read write sing talk hear see look feel think know want need like help start "
    "stop open close build break grow fall rise hold bring send pay buy sell meet join "
    "north south east west left right front back top side end edge center middle base"
)
WORDS = tuple(_PARAGRAPH.split())


def words(seed: str, tokens: int) -> str:
    """About ``tokens`` tokens of the generator seeded with ``seed``: words, each with a
    leading space, and a full stop (a token too) after every twelfth."""
    rng = random.Random(seed)  # a str seed is hashed with SHA-512: the same in every process
    out = []
    count = 0
    while len(out) < tokens:
        out.append(" " + rng.choice(WORDS))
        count += 1
        if count % 12 == 0 and len(out) < tokens:
            out.append(".")
    return "".join(out)


def tagged(tag: str, seed: str, tokens: int) -> str:
    """Text of about ``tokens`` tokens that starts with ``tag`` (e.g. ``"doc 17:"``): the tag
    keeps texts apart from their first block, the words fill the rest."""
    tag_tokens = len(tag.split()) + 1  # a number or a colon is often a token of its own
    return tag + words(seed, max(0, tokens - tag_tokens))
