"""The side column's live panels: speculation, GPU telemetry, the local API server, and their plots."""
