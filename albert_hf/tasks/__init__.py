"""The fine-tuning jobs (run_glue.py, run_squad.py, run_race.py, run_ner.py) and the skeleton they share
(finetuning.py). Each task is a package of the same shape: glue/, squad/, race/, ner/ and own_data/ (your own
labelled data, through run_glue.py), each with `data.py` (its data arguments and reading), `features.py` (the model's
inputs) and `definition.py` (what the task is: its labels, metric, baseline and the paper's rows), and `evaluation.py`
where the task evaluates or predicts its own way (predictions files, SQuAD's Trainer). The fine-tuned model's card is
written by `finetuned_card.py`."""
