"""Is the server answering at a URL the one we started? (stdlib only: ``scripts/serve_vllm.sh``
runs this file directly, before the package may be importable.)

A port that another server holds is refused before ours starts, but another server could still
take the port while ours loads (ours then dies with "address in use"), and a second server of the
same folder name answers to the same served name. So a server counts as ready only when both hold:

* the socket listening on the URL's port belongs to a process of the started server's process
  group (``scripts/serve_vllm.sh`` starts it in a session of its own, so its group is its PID);
* its ``/models`` lists the served name with ``root`` equal to the model folder it was given
  (vLLM reports the ``--model`` argument there).

    python3 aria/llm/server_check.py PID BASE_URL MODEL_DIR NAME    # exit 0: ours and ready; 1: not (yet)
"""
from __future__ import annotations

import json
import os
import sys
import urllib.error
import urllib.request
from urllib.parse import urlparse


def listening_inodes(port: int) -> set[str]:
    """Socket inodes listening on ``port`` (TCP, IPv4 and IPv6) in this network namespace."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = open(table, encoding="ascii").read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "0A":  # 0A: LISTEN
                inodes.add(fields[9])
    return inodes


def group_listens(pid: int, port: int) -> bool:
    """Whether a process in ``pid``'s process group holds a socket listening on ``port``."""
    inodes = listening_inodes(port)
    try:
        group = os.getpgid(pid)
    except OSError:
        return False
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.getpgid(int(entry)) != group:
                continue
            for fd in os.listdir(f"/proc/{entry}/fd"):
                link = os.readlink(f"/proc/{entry}/fd/{fd}")
                if link.startswith("socket:[") and link[8:-1] in inodes:
                    return True
        except OSError:  # a process that ended meanwhile, or one we may not look into
            continue
    return False


def serves(base_url: str, model_dir: str, name: str) -> bool:
    """Whether ``base_url/models`` lists ``name`` served from ``model_dir``."""
    try:
        with urllib.request.urlopen(base_url.rstrip("/") + "/models", timeout=5) as response:
            models = json.load(response).get("data") or []
    except (OSError, ValueError, urllib.error.URLError):
        return False
    return any(m.get("id") == name and m.get("root") == model_dir for m in models if isinstance(m, dict))


def ours(pid: int, base_url: str, model_dir: str, name: str) -> bool:
    port = urlparse(base_url).port
    return port is not None and serves(base_url, model_dir, name) and group_listens(pid, port)


if __name__ == "__main__":
    if len(sys.argv) != 5:
        sys.exit("usage: server_check.py PID BASE_URL MODEL_DIR NAME")
    sys.exit(0 if ours(int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]) else 1)
