"""`flashdesk serve`: the loaded engine behind an OpenAI-compatible HTTP API, one request at a time."""
