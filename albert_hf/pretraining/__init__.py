"""The pretraining job (run_pretraining.py), read in this order: `job.py` (parse, setup, finish), `loop.py` (fit) and
their `arguments.py` (resolved in `flags.py`; the other modes in `modes.py`); the data path `inputs.py` (corpus.py,
embedded_corpus.py and splits.py -> the tokenizer -> sentences.py -> pairs.py -> collator.py, or
prepared_data.py); `model.py`; one optimizer step in `step.py` (`step_graph.py` captures it as a CUDA graph);
`log.py`; `checkpoints.py`, `divergence.py` and `final_folder.py` for what it writes."""
