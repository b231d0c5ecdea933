"""`flashdesk serve`: the model behind an OpenAI-compatible API on this machine (engine/serve/).

    flashdesk serve --model DIR --draft DIR            # http://127.0.0.1:8719/v1
    flashdesk serve --demo                             # the demo pair, no download
    flashdesk serve --model DIR --host 0.0.0.0 --api-key KEY

The address rule comes first, before a byte is loaded: any host but a loopback address needs an
API key (--api-key or FLASHDESK_API_KEY). Then the port is bound (a busy one fails at once), the
engine loaded, and uvicorn serves until Ctrl-C (exit status 0).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from flashdesk.engine.errors import FlashDeskError

KEY_VARIABLE = "FLASHDESK_API_KEY"
DEFAULT_PORT = 8719


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from flashdesk.engine.cli.cli_args import add_speculation_flags, positive_int

    parser.add_argument("--model", help="folder (or pulled Hub id) of the Gemma 4 target (required unless --demo)")
    parser.add_argument(
        "--demo", action="store_true", help="serve the demo pair (a tiny target and drafter, made in the data folder)"
    )
    parser.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (default 127.0.0.1: this computer only; any other needs --api-key)",
    )
    parser.add_argument(
        "--port", type=_port, default=DEFAULT_PORT, help=f"TCP port (default {DEFAULT_PORT}; 0: a free one)"
    )
    parser.add_argument(
        "--api-key",
        help=f"require 'Authorization: Bearer KEY' on every route but /health "
        f"(default: the {KEY_VARIABLE} environment variable)",
    )
    parser.add_argument("--device", default="auto", help="auto, cpu or cuda")
    parser.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float32"])
    parser.add_argument("--kv-dtype", default="auto", choices=["auto", "bfloat16", "float32", "fp8"])
    parser.add_argument(
        "--context", type=positive_int, help="context limit in tokens (default: the model's, or what fits the GPU)"
    )
    parser.add_argument("--quantize", choices=["int4"], help="quantize a bf16 checkpoint to int4 while loading")
    add_speculation_flags(parser)


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"a port is 0..65535, got {value}")
    return value


def run_serve(args) -> int:
    from flashdesk.engine.serve.auth import check_exposure

    key = args.api_key or os.environ.get(KEY_VARIABLE) or None
    check_exposure(args.host, key)  # before anything is loaded
    if args.demo and (args.model or args.draft or args.assistant):
        raise FlashDeskError("--demo serves the demo pair; leave out --model, --draft and --assistant")
    if not args.demo and not args.model:
        raise FlashDeskError("give --model DIR (and --draft DIR for speculative decoding), or --demo")
    if args.demo:
        from flashdesk.engine.hub.demo import demo_pair

        args.model, args.draft = demo_pair()
    else:
        from flashdesk.engine.cli.cli_args import resolve_models

        resolve_models(args)
    return _serve(args, key)


def _serve(args, key: str | None) -> int:
    from flashdesk.engine.serve.app import create_app
    from flashdesk.engine.serve.runner import Runner
    from flashdesk.engine.serve.server import Server, bind, config, served_name, url
    from flashdesk.engine.cli.cli_args import load_engine
    from flashdesk.engine.loading.model_card import sampling_defaults

    sock = bind(args.host, args.port)  # a busy port fails now, not after the load
    try:
        engine, control = load_engine(args)
        if engine.tokenizer is None:
            raise FlashDeskError(
                f"{args.model} has no tokenizer (tokenizer.json and a chat template): the API takes chat messages"
            )
        name = served_name(Path(args.model))
        runner = Runner(engine, control)
        address = url(args.host, sock.getsockname()[1])

        def listening() -> None:
            print(
                f"flashdesk serve: {name} at {address}/v1 (OpenAI-compatible"
                f"{', API key required' if key else ''}; Ctrl-C stops)",
                flush=True,
            )

        app = create_app(runner, name, key, sampling_defaults(Path(args.model)))
        server = Server(config(app, quiet=False), on_started=listening, on_stopping=runner.close)
        try:
            server.run(sockets=[sock])
        except KeyboardInterrupt:  # Ctrl-C, how a server is stopped: uvicorn raises it again once it has stopped
            pass
        finally:
            runner.close()
    finally:
        sock.close()
    print("flashdesk serve: stopped", file=sys.stderr)
    return 0
