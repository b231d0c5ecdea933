"""The command line: generate, bench, doctor, models."""
