"""The inference engine (torch). Never imports Qt."""
