"""Semantic cache benchmarks: guards, the rule, the language gate, one lookup, index rebuilds, GPTCache."""
