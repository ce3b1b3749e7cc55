"""Prompts far enough apart that none is a semantic hit for another (checked in test_hostile_input)."""

from __future__ import annotations

TOPICS = (
    "How do I bake sourdough bread at home?",
    "What is the capital of Australia?",
    "Explain quantum entanglement to a child.",
    "Which vaccines does a puppy need?",
    "How do I change a flat bicycle tyre?",
    "Summarise the plot of Hamlet.",
    "What causes the northern lights?",
    "Write a haiku about autumn rain.",
    "How much protein should an adult eat daily?",
    "Translate 'good morning' into Japanese.",
    "Why did the Roman Empire fall?",
    "How do I configure a VPN on Linux?",
    "What is the boiling point of water on Everest?",
    "Recommend a beginner chess opening.",
    "How do tax brackets work in Canada?",
    "What is the difference between TCP and UDP?",
    "How can I get rid of aphids on roses?",
    "Who painted the Sistine Chapel ceiling?",
    "What is a good stretching routine for runners?",
    "How do I invert a binary tree in Python?",
    "What are the symptoms of iron deficiency?",
    "Describe how a jet engine produces thrust.",
    "Which wine goes well with grilled salmon?",
    "How do I file a patent in Europe?",
)

# Near-duplicates (another exact key, the same meaning): semantic hits under the calibrated rule.
PARAPHRASES = (
    ("How do I bake sourdough bread at home ?", TOPICS[0]),
    ("What is the capital of Australia ?", TOPICS[1]),
)
