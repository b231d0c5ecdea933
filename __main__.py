"""The `flashdesk` command: no arguments opens the window, a subcommand runs the engine CLI.

This module imports neither Qt nor torch at the top so each path loads only what it needs.
"""

import sys


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        from flashdesk.app.main import run_app

        return run_app()
    from flashdesk.engine.cli.main import main as engine_main

    return engine_main(argv)


if __name__ == "__main__":
    sys.exit(main())
