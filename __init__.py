"""FlashDesk: a desktop chat app with its own Gemma 4 engine and DFlash speculative decoding.

The package maps the repository root: `flashdesk.app` (Qt), `flashdesk.engine` (torch),
`flashdesk.kernels` (Triton). See docs/architecture.md.
"""

import os
import sys

__version__ = "0.1.0"


def _unshadow() -> None:
    """Take a checkout's root off sys.path. Run from there (`python -m ...` puts the working folder
    first), its folders would import as top-level `kernels`, `engine` and `app`, shadowing other
    distributions of those names: transformers imports Hugging Face's `kernels` when it is
    installed. The root is flashdesk itself, never a place to import other modules from."""
    root = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [entry for entry in sys.path if os.path.abspath(entry or os.curdir) != root]


_unshadow()
