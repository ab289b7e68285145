"""The fine-tuning jobs (run_glue.py, run_squad.py, run_race.py, run_ner.py) and the skeleton they share
(finetuning.py). Each task is a package of the same shape: glue/, squad/, race/, ner/ and own_data/ (your own
labelled data, through run_glue.py), each with `data.py` (its data arguments and reading), `features.py` (the model's
inputs) and `recipe.py` (the paper's recipe, the metric, the baseline), and `job.py` where the script has steps of
its own (predictions files, SQuAD's Trainer)."""
