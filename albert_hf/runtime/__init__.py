"""What every job runs on: the command line, hardware and precision, processes, signals, the output folder's lock, disk
writes and input files."""
