"""Real components for testing and benchmarking pipelines without a model (servers, not mocks)."""
