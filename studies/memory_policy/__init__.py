"""The memory-policy study: the bars registered for its published runs, the pilot and published
records, and the diagnostics its results cite (studies/README.md)."""
