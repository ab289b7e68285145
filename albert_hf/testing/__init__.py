"""Synthetic inputs for tests, benchmarks and examples: GLUE folders in the original layout."""
