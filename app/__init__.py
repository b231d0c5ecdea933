"""The desktop front end (Qt). Never imports torch: it talks to the engine worker by messages."""
