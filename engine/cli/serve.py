"""`flashdesk serve`: the model behind an OpenAI-compatible API on this machine (engine/serve/).

    flashdesk serve --model DIR --draft DIR            # http://127.0.0.1:8719/v1
    flashdesk serve --demo                             # the demo pair, no download
    flashdesk serve --model DIR --host 0.0.0.0 --api-key KEY

The address rule comes first, before a byte is loaded: any host but a loopback address needs an
API key (--api-key or FLASHDESK_API_KEY). Then the port is bound (a busy one fails at once), the
engine loaded, and uvicorn serves until Ctrl-C or SIGTERM (exit status 0 either way, after the
closing line). The limits on clients (serve/limits.py) and the names and web origins it answers
(serve/hosts.py, serve/cors.py) are options too.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from pathlib import Path

from flashdesk.engine.errors import FlashDeskError

KEY_VARIABLE = "FLASHDESK_API_KEY"
DEFAULT_PORT = 8719


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from flashdesk.engine.cli.cli_args import add_speculation_flags, positive_int
    from flashdesk.engine.serve.limits import Limits

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
        help=f"require 'Authorization: Bearer KEY' on every route but /health; a comma list gives several "
        f"keys, each with a prefix cache of its own (default: the {KEY_VARIABLE} environment variable)",
    )
    parser.add_argument(
        "--allowed-hosts",
        default="",
        help="more names the server answers to in the Host header, a comma list ('*': any); it always "
        "answers to localhost, 127.0.0.1 and [::1], and, on another address, to that address",
    )
    parser.add_argument(
        "--cors-origins",
        default="",
        help="web origins that may call the API from a browser, a comma list "
        "(http://localhost:3000) or '*' (default: none)",
    )
    defaults = Limits()
    parser.add_argument(
        "--header-timeout",
        type=_seconds,
        default=defaults.header_seconds,
        help=f"seconds a client has to send a request's headers (default {defaults.header_seconds:g})",
    )
    parser.add_argument(
        "--body-timeout",
        type=_seconds,
        default=defaults.body_seconds,
        help=f"seconds a client has to send a request's body (default {defaults.body_seconds:g})",
    )
    parser.add_argument(
        "--max-queue",
        type=positive_int,
        default=defaults.max_queue,
        help=f"chat requests taken at once, running or waiting; more get a 429 (default {defaults.max_queue})",
    )
    parser.add_argument(
        "--request-timeout",
        type=_seconds,
        default=defaults.request_seconds,
        help="seconds a chat request may take from its arrival, its wait included; a reply still running "
        f"then ends (finish_reason 'length') (default {defaults.request_seconds:g}; 0: no limit)",
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


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"seconds are 0 or more, got {text}")
    return value


class Terminated(Exception):
    """SIGTERM, raised once uvicorn has stopped (it hands the signal on after its graceful shutdown)."""


def _terminated(signum, frame) -> None:
    raise Terminated


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
    from flashdesk.engine.serve.cors import parse_origins
    from flashdesk.engine.serve.hosts import allowed_hosts
    from flashdesk.engine.serve.limits import Limits
    from flashdesk.engine.serve.runner import Runner
    from flashdesk.engine.serve.server import Server, bind, close_app, config, served_name, url
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

        limits = Limits(args.header_timeout, args.body_timeout, args.max_queue, args.request_timeout)
        app = create_app(
            runner,
            name,
            key,
            sampling_defaults(Path(args.model)),
            limits=limits,
            hosts=allowed_hosts(args.host, args.allowed_hosts.split(",")),
            cors_origins=parse_origins(args.cors_origins),
        )
        server = Server(config(app, quiet=False, limits=limits), on_started=listening, on_stopping=runner.close)
        main = threading.current_thread() is threading.main_thread()  # where signal handlers can be set
        previous = signal.signal(signal.SIGTERM, _terminated) if main else None
        try:
            server.run(sockets=[sock])
        except (KeyboardInterrupt, Terminated):  # Ctrl-C or SIGTERM: uvicorn raises it again once it has stopped
            pass
        finally:
            if main:
                signal.signal(signal.SIGTERM, previous)
            runner.close()
            close_app(app)
    finally:
        sock.close()
    print("flashdesk serve: stopped", file=sys.stderr)
    return 0
