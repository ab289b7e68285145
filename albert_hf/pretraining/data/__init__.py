"""The pretraining data: text -> sentences -> pairs -> batches (`inputs.py` assembles them), or pairs prepared
once (`prepared_data.py`)."""
