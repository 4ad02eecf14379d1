"""memsearch: memory-augmented agents for multi-hop QA under a fixed budget."""
__version__ = "0.1.0"
