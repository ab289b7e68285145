"""Your own labelled data in run_glue.py (no --task_name), shaped as every task: data.py (csv/tsv/json/jsonl/parquet
files, a Hub dataset or a saved folder read the way transformers' run_glue.py reads them), features.py (which
columns are the texts, the labels) and definition.py (`OwnTask`: classification or regression, its metric and
predictions). Its texts are tokenized as GLUE's (glue/features.py)."""
