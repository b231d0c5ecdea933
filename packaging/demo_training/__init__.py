"""The stages of packaging/train_demo.py, which trains the demo pair (one module a stage)."""
