"""FlashDesk: a desktop chat app with its own Gemma 4 engine and DFlash speculative decoding.

The package maps the repository root: `flashdesk.app` (Qt), `flashdesk.engine` (torch),
`flashdesk.kernels` (Triton). See docs/architecture.md.
"""

__version__ = "0.1.0"
