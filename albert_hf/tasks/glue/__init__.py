"""GLUE for run_glue.py, shaped as every task: data.py (`GlueDataArguments`, the splits read and prepared), files.py
(the GLUE file formats, the submission files), features.py (the texts tokenized), definition.py (the tasks,
their rows of the paper's recipe, metrics and baselines) and evaluation.py (the test sets' predictions)."""
