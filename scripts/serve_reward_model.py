#!/usr/bin/env python3
"""Serve a trained reward model over HTTP for online ARIA (``reward_model.serve.name=http``).

    python scripts/serve_reward_model.py outputs/reward_model/cpu/final --port 8100 [--device cuda:7]

Routes (aria/reward_service.py): GET /health, POST /score {"samples": [{"observation", "action"}]},
POST /load {"path"} (the online trainer loads each refreshed reward model this way).
"""
import argparse
import logging

from aria.reward_service import InProcessScorer, make_server


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model_dir", help="a trained reward-model folder (train_rm.py's final/)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8100)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--max-prompt-tokens", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=16)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO)
    scorer = InProcessScorer(args.model_dir, args.max_prompt_tokens, args.batch_size, args.dtype, args.device)
    server = make_server(scorer, args.host, args.port)
    print(f"[reward model] serving {args.model_dir} at http://{args.host}:{server.server_address[1]}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    main()
