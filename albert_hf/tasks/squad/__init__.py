"""SQuAD v1.1 / v2.0 for run_squad.py, shaped as every task: data.py (`SquadDataArguments`, the questions read),
features.py (the windows), recipe.py (the paper's rows, F1, the baseline), job.py (`SquadTrainer`, the files) and
postprocess.py (answers and metrics from the windows' logits)."""
