"""The fine-tuning jobs (run_glue.py, run_race.py, run_squad.py, run_ner.py) and the skeleton they share."""
