"""SQuAD v1.1 / v2.0: features, the job, post-processing."""
