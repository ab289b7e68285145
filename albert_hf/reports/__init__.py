"""What the jobs report beside their results: the held-out baselines a run's numbers are judged against
(`baselines`), the training curves (`curves`) and fill-mask examples (`fill_mask`)."""
