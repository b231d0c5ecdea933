"""The demo model: a tiny trained Gemma 4 target and its DFlash drafter, copied from assets/demo_model/.

Why: every part of the app (streaming, speculation statistics, telemetry, storage) should work on
a machine without a GPU or downloaded weights, and the app's tests drive the real worker with it.
The pair was trained on the CPU by packaging/train_demo.py (its defaults write these bytes in about
51 minutes; NOTICE.md has the runs) on FlashDesk's own documentation and the Python standard
library's source (PSF-licensed; see assets/demo_model/NOTICE.md): a 2.4 M-parameter Gemma 4
of the 26B-A4B's architecture (hidden 128, six layers, sliding and full attention, 8 experts top-2
beside a dense MLP, a 4096-token BPE with Gemma 4's special tokens and chat template) and a 3-layer
DFlash drafter trained against it with the DFlash recipe (6 MB in all). Its text reads like code or
English from a very small model (it is not meant to be right), and speculation pays on the CPU as it
does on a GPU with the real pair.

The folders are in the exact on-disk layouts of the real checkpoints (a `Gemma4ForCausalLM`
config.json and bf16 safetensors with the tokenizer files, z-lab's drafter config and weights), so
the engine loads them by its normal path. No transformers or dflash is needed to create them.

    python -m flashdesk.engine.hub.demo FOLDER     # writes FOLDER/target and FOLDER/drafter
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

DEMO_ASSETS = Path(__file__).resolve().parents[2] / "assets" / "demo_model"
MARKER = "flashdesk-demo.json"  # written last: a folder without it is incomplete
DEMO_VERSION = 3  # 1 was the random pair, 2 a pair no committed script revision makes; others are rewritten


def demo_paths(folder: str | Path) -> tuple[Path, Path]:
    folder = Path(folder)
    return folder / "target", folder / "drafter"


def is_complete(folder: str | Path) -> bool:
    marker = Path(folder) / MARKER
    try:
        return json.loads(marker.read_text(encoding="utf-8")).get("version") == DEMO_VERSION
    except (OSError, ValueError, AttributeError):
        return False


def create_demo(folder: str | Path, force: bool = False) -> tuple[Path, Path]:
    """Write the demo pair under `folder` unless a complete one is there; return (target, drafter)."""
    folder = Path(folder)
    target, drafter = demo_paths(folder)
    if is_complete(folder) and not force:
        return target, drafter
    (folder / MARKER).unlink(missing_ok=True)
    for part in (target, drafter):
        if part.exists():
            shutil.rmtree(part)
        shutil.copytree(DEMO_ASSETS / part.name, part)
    (folder / MARKER).write_text(
        json.dumps(
            {
                "version": DEMO_VERSION,
                "note": "FlashDesk's demo pair: a tiny Gemma 4 and DFlash drafter trained by packaging/train_demo.py",
            },
            indent=2,
        )
        + "\n",
        encoding="utf-8",
    )
    return target, drafter


def demo_pair() -> tuple[str, str]:
    """(target, drafter) folders of the demo pair in the user's data folder, made there if missing:
    what `--demo` stands for in generate, chat, bench and serve."""
    from flashdesk import paths

    target, drafter = create_demo(paths.demo_dir())
    return str(target), str(drafter)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m flashdesk.engine.hub.demo FOLDER", file=sys.stderr)
        return 2
    target, drafter = create_demo(argv[0])
    print(f"target  {target}\ndrafter {drafter}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
