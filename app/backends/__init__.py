"""What the window talks to for replies: the local engine worker (a child process, by messages) or
an OpenAI-compatible server, behind one interface; and the readers of their metrics."""
