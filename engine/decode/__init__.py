"""Running a generation: sampling, the speculative decode loop, chat text, statistics."""
