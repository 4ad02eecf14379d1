"""End-to-end pipelines (``memsearch pipeline ...``): prepare, train, merge, evaluate, report."""
