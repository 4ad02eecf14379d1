"""The MemAgent study: its published CPU demonstration read back from its records (studies/README.md)."""
