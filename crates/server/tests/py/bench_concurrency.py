"""By-hand load check of a running `hearth serve`: N streaming clients for T seconds.

Reports errors, replies, aggregate generated tokens per second (from the usage of each reply),
the server's active sequences afterwards and, with --pid, its RSS before and after.

    .venv/bin/python crates/server/tests/py/bench_concurrency.py --url http://127.0.0.1:8080 \
        --clients 32 --seconds 120 --pid $(pgrep -f 'hearth serve')
"""

import argparse
import concurrent.futures
import re
import threading
import time

import httpx
import openai


def rss_kib(pid):
    if not pid:
        return None
    with open(f"/proc/{pid}/status") as f:
        m = re.search(r"VmRSS:\s+(\d+)", f.read())
    return int(m.group(1)) if m else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--pid", type=int)
    a = ap.parse_args()
    c = openai.OpenAI(base_url=a.url + "/v1", api_key="none", max_retries=0, timeout=600)
    lock = threading.Lock()
    stats = {"replies": 0, "tokens": 0, "errors": []}
    rss0 = rss_kib(a.pid)
    deadline = time.time() + a.seconds

    def client(i):
        n = 0
        while time.time() < deadline:
            n += 1
            try:
                usage = None
                for chunk in c.chat.completions.create(
                    model="x", messages=[{"role": "user", "content": f"Client {i}, request {n}: tell me a story."}],
                    max_tokens=a.max_tokens, temperature=0.7, seed=i * 1000 + n, stream=True,
                    stream_options={"include_usage": True},
                ):
                    usage = chunk.usage or usage
                with lock:
                    stats["replies"] += 1
                    stats["tokens"] += usage.completion_tokens
            except Exception as e:  # noqa: BLE001
                with lock:
                    stats["errors"].append(repr(e))

    t0 = time.time()
    with concurrent.futures.ThreadPoolExecutor(a.clients) as ex:
        list(ex.map(client, range(a.clients)))
    dt = time.time() - t0
    time.sleep(0.5)
    metrics = httpx.get(a.url + "/metrics").text
    active = re.search(r"^hearth_active_sequences (\S+)$", metrics, re.M).group(1)
    queued = re.search(r"^hearth_queue_depth (\S+)$", metrics, re.M).group(1)
    print(f"clients={a.clients} seconds={dt:.1f} replies={stats['replies']} errors={len(stats['errors'])} "
          f"gen_tok/s={stats['tokens'] / dt:.1f} active_after={active} queued_after={queued} "
          f"rss_kib_before={rss0} rss_kib_after={rss_kib(a.pid)}")
    for e in stats["errors"][:5]:
        print("  error:", e)


if __name__ == "__main__":
    main()
