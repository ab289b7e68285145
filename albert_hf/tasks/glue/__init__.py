"""GLUE for run_glue.py: the tasks and their recipes (tasks.py), reading the files and writing the submission files
(files.py), and the run's steps on a GLUE task or on the user's own data (job.py)."""
