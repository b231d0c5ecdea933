"""Shared test setup.

Qt runs offscreen in the tests: no display is needed and no window pops up on a desktop.
This must happen before pytest-qt creates the QApplication.
"""

import os

os.environ["QT_QPA_PLATFORM"] = "offscreen"
