"""Token classification (named entities, part-of-speech tags) for run_ner.py, shaped as every task: data.py
(`NerDataArguments`, CoNLL or json read, the tags), features.py (word-to-piece label alignment), definition.py
(entity metrics, the baseline) and evaluation.py (the predictions file)."""
