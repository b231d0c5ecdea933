"""The engine's errors: each one says what is wrong and where, so the CLI and the app can show it as is."""


class FlashDeskError(Exception):
    """Base of every error the engine raises on bad input (never on its own bugs)."""


class ConfigError(FlashDeskError):
    """A config.json that is missing, unreadable, or describes something we do not support."""


class CheckpointError(FlashDeskError):
    """Weights that are missing, extra, misshapen, of the wrong dtype, or in a damaged file."""


class ContextOverflowError(FlashDeskError):
    """A prompt plus the requested new tokens does not fit in the context limit."""
