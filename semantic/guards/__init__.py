"""Guards: cheap textual checks (a prompt's language, numbers, negation, edits, near-duplicates) run before the verifier."""
