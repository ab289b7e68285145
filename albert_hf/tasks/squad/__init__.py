"""SQuAD v1.1 / v2.0 for run_squad.py, shaped as every task: data.py (`SquadDataArguments`, the questions read),
features.py (the windows), definition.py (the paper's rows, F1, the baseline), evaluation.py (`SquadTrainer`, the
files) and
postprocess.py (answers and metrics from the windows' logits)."""
