"""Conversations kept on disk: the SQLite store, export to Markdown and JSON, and titles."""
