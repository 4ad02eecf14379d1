"""memsearch: memory-augmented agents for multi-hop QA under a fixed budget."""
__version__ = "0.1.0"
# The distribution's name (pyproject.toml [project] name; "memsearch" on the package index is an
# unrelated project): installed metadata is read with it, never with the import name.
DISTRIBUTION = "memsearch-rl"
