"""Evaluation: per-task answer and provenance metrics, aggregation, paired bootstrap comparisons."""
