"""RACE (Lai et al., 2017) for run_race.py, shaped as every task: data.py (`RaceDataArguments`, the questions
read), features.py (the official input formatting), definition.py (the paper's rows, accuracy, the baseline) and
evaluation.py
(the predictions file)."""
