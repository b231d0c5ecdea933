"""The parts of packaging/reliability.py: engine and app kills, the soak, and the bad-input catalogue."""
