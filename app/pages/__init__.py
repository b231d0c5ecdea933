"""Whole pages of the window besides the chat: model setup and the benchmark."""
