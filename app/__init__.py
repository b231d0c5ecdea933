"""The desktop front end (Qt). Never imports torch: it talks to the engine worker by messages."""

from flashdesk.app import qt_compat

qt_compat.guard()
