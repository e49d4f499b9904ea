#!/usr/bin/env python3
"""Serve a trained reward model over HTTP for online ARIA (``reward_model.serve.name=http``).

    ARIA_REWARD_TOKEN=... python scripts/serve_reward_model.py outputs/reward_model/cpu/twenty_questions/final --port 8100 \\
        --load-root outputs [--device cuda:7]

Routes (aria/trainers/reward_service.py): GET /health, POST /score {"samples": [{"observation", "action"}]},
POST /load {"path"} (the online trainer loads its first reward model and each refreshed one this
way; pass a folder holding both, the first model and the trainer's output_dir, as --load-root;
without one, /load is off).

The service listens on 127.0.0.1 unless --host says otherwise. When the environment variable named
by --token-env (ARIA_REWARD_TOKEN) is set, every request needs ``Authorization: Bearer <token>``;
the online trainer sends it from the same variable (reward_model.serve.token_env).
"""
import argparse
import logging
import os
import sys

from aria.cli import number, protect_terminal, torch_device
from aria.trainers.reward_service import InProcessScorer, make_server


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model_dir", help="a trained reward-model folder (train_rm.py's final/)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (127.0.0.1: this machine only)")
    parser.add_argument("--port", type=number(int, ge=0, le=65535), default=8100, help="0: any free port")
    parser.add_argument("--load-root", default=None, help="/load serves only reward models below this folder (default: off)")
    parser.add_argument("--token-env", default="ARIA_REWARD_TOKEN",
                        help="environment variable holding the bearer token requests must carry (unset: no check)")
    parser.add_argument("--max-body-mb", type=number(float, gt=0), default=16.0, help="largest request body read")
    parser.add_argument("--request-timeout", type=number(float, gt=0), default=60.0, help="seconds a client may take to send a request")
    parser.add_argument("--device", type=torch_device, default="cpu")
    parser.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
                        help="auto = bfloat16 where the hardware computes it natively")
    parser.add_argument("--max-prompt-tokens", type=number(int, ge=1), default=512)
    parser.add_argument("--batch-size", type=number(int, ge=1), default=16, help="samples per pass of --packing padded")
    parser.add_argument("--packing", default="prefix_tree", choices=["prefix_tree", "padded"],
                        help="prefix_tree: a game's steps share their history's tokens in one pass")
    parser.add_argument("--pack-tokens", type=number(int, ge=1), default=2048, help="the most tokens in one prefix-tree pass")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO)
    token = os.environ.get(args.token_env) or None
    try:
        scorer = InProcessScorer(args.model_dir, args.max_prompt_tokens, args.batch_size, args.dtype, args.device,
                                 args.packing, args.pack_tokens)
    except (OSError, ValueError) as err:
        print(f"error: {args.model_dir}: {err}", file=sys.stderr)
        sys.exit(2)
    try:
        server = make_server(scorer, args.host, args.port, token=token, load_root=args.load_root,
                             max_body_bytes=int(args.max_body_mb * 2**20), request_timeout=args.request_timeout)
    except OSError as err:  # the port is taken, the address is not this machine's
        print(f"error: --host {args.host} --port {args.port}: {err.strerror or err}", file=sys.stderr)
        sys.exit(2)
    print(f"[reward model] serving {args.model_dir} at http://{args.host}:{server.server_address[1]} "
          f"(bearer token {'required' if token else 'off'}; /load {'below ' + args.load_root if args.load_root else 'off'})",
          flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    protect_terminal()  # no secret of the command line reaches the terminal, Hydra's messages included
    main()
