"""Near-duplicates hit without the verifier; anything that could change the answer does not."""

from __future__ import annotations

import pytest

from semantic.guards.near_duplicate import near_duplicate_reason


@pytest.mark.parametrize(
    ("stored", "asked", "reason"),
    [
        ("How do I reset my password?", "how do i reset my password", "same text"),
        ("How often should I water a snake plant?", "Quick question: how often should I water a snake plant? Thanks!", "same words"),
        ("What's a null hypothesis?", "What is a null hypothesis? Please", "same words"),
        ("How do I get an EIN for my LLC?", "How do I get an employer identification number for my limited liability company?", "same words"),
        ("How do I recieve a refund?", "How do I receive a refund?", "one word spelt differently"),
        ("What colour is the sky at dusk?", "What color is the sky at dusk?", "one word spelt differently"),
        ("Where is the city centre?", "Where is the city center?", "one word spelt differently"),
        ("In Python, how do I sort a list?", "How do I sort a list in Python?", "a clause moved"),
        ("How do I reset my password?", "How can I reset my password?", "same words"),  # a how-to opener
        ("How do I reset my password?", "Tell me how to reset my password.", "same words"),
        ("How do I reset my password?", "Can you tell me how to reset my password?", "same words"),
        ("How do I set up multi-factor authentication?", "How do I set up MFA?", "same words"),  # a hyphen
        ("What are key performance indicators for a support team?", "What are KPIs for a support team?", "same words"),
        ("How do I repair a squeaky floorboard?", "How do I fix a squeaky floorboard?", "words for the same thing"),
        ("How do I get rid of mould in my shower?", "How do I eliminate mould in my shower?", "words for the same thing"),
        ("Why is my cat throwing up after eating?", "Why is my cat vomiting after eating?", "words for the same thing"),
        ("What's the difference between an invoice and a receipt?", "whats the diffrence between an invoce and a reciept", "3 words spelt differently"),
        ("How large is the Milky Way?", "How big is the Milky Way? Thanks!", "words for the same thing"),
        ("What are the early signs of anaemia?", "What are the early signs of anemia?", "one word spelt differently"),
        ("How do I enrol in the pension scheme?", "How do I enroll in the pension scheme?", "one word spelt differently"),
        ("Is the café open on Sundays?", "Is the cafe open on Sundays?", "one word spelt differently"),
        ("Is this an aesthetic choice?", "Is this an esthetic choice?", "one word spelt differently"),
        ("goroutine leak how to detect", "gorutine leak how to detect", "one word spelt differently"),
        ("How do I redirect HTTP to HTTPS in nginx?", "How do I redirect HTTP to HTTPS in ngnix?", "one word spelt differently"),
        ("What skills are necessary when making decisions?", "What skills are necessary when making decision?", "one word spelt differently"),
    ],
)  # fmt: skip
def test_near_duplicates_hit(stored: str, asked: str, reason: str) -> None:
    assert near_duplicate_reason(asked, stored) == reason


@pytest.mark.parametrize(
    ("stored", "asked"),
    [
        ("What does ~ mean in C++?", "What does % mean in C++?"),  # symbols are words here
        (
            "What is the difference between () and [] in Python?",
            "What is the difference between = and == in Python?",
        ),
        ("How do I translate '才' to English?", "How do I translate 笑点 to English?"),
        ("Does a dog bite a man?", "Does a man bite a dog?"),  # the same words, not a clause moved
        ("Where is the desert?", "Where is the dessert?"),  # two words, not a typo
        ("What is an angle?", "What is an angel?"),
        # Rarer words the embedder's vocabulary lacks are still words (pyspellchecker's list), not typos.
        ("Is maternity leave paid?", "Is paternity leave paid?"),
        ("How do you convert ethane to ethene?", "How do you convert ethene to ethane?"),
        ("What are probiotics?", "What are prebiotics?"),  # two unknown words, another prefix
        ("Is ain't a word?", "Is amn't a word?"),
        ("How do I reset my password?", "Why can't I reset my password?"),  # another question word
        ("How do I reset my password?", "How do I reset the password?"),  # a rewording: the verifier's call
        ("Tell me about Paris", "Tell me about Rome"),
        ("Thanks", "Please"),  # nothing but filler: never a hit
        ("How can I stop pit stains?", "How can I remove pit stains?"),  # prevent is not remove: not listed
        ("How do I fix a squeaky floorboard?", "How do I fix a squeaky door?"),  # a listed word is not enough
        ("How do I fix a squeaky floorboard?", "How do I repair a squeaky door?"),
        (
            "what is the diference betwen an invoce and a reciept fom",
            "What is the difference between an invoice and a receipt from",
        ),  # four typos
        ("What is a KPI?", "What is a KPIs dashboard?"),
    ],
)
def test_what_could_change_the_answer_is_not_a_near_duplicate(stored: str, asked: str) -> None:
    assert near_duplicate_reason(asked, stored) is None
